#!/bin/bash
# Session 26, call 1 (issue 16): 1. upload_events.py (session 25's, not yet run) at 256 and 64
# rows: the masks' copy and copy-to-tokens time inside a constrained run, with CUDA events;
# 2. the structured bench (constrained vs free, 64 and 256 rows) twice. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; P=docs/results/s25/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
for b in 256 64; do
  timeout 90 python $P/upload_events.py --tokenizer-dir .gpu --batch $b --out $OUT/upload$b.json 2>&1 | grep -E "^b=|Error|error" | tail -3
done
structured() {  # $1 label
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured N1
structured N2
date -u; echo "took $(( $(date +%s) - S )) s"
