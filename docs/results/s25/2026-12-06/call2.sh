#!/bin/bash
# Session 25, call 2 (issue 16): the fill beside the commit (restored from 2c1b876) on top of the
# masks' copy beside the forward. 1. the structured CUDA tests; 2. the structured bench taking
# turns: B (ASERVE_FILL_BESIDE=1, the tree) and A (=0, the fill, then the commit's rest);
# 3. the host's timeline at 256 rows (timeline.py), beside and not, if time is left.
# Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-300}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 90 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 ASERVE_FILL_BESIDE
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_FILL_BESIDE=$2 timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured B1 1
structured A1 0
structured B2 1
structured A2 0
for f in 1 0; do L=$(left); [ $L -gt 45 ] || break
  ASERVE_FILL_BESIDE=$f timeout $L python docs/results/s25/2026-12-06/timeline.py --batch 256 --out $OUT/timeline256_beside$f.json 2>&1 | grep -v "^20..-" | grep -v Warn
done
date -u; echo "took $(( $(date +%s) - S )) s"
