#!/bin/bash
# Session 26, call 4 (issue 16), at cd8160c (the distinct-mask copy reverted): the host's chain
# at 256 rows, two of its parts tried, taking turns: A the tree; S serial_advance.py (the
# commit's grammar advance one row after another, not on the pool); T ASERVE_MASK_FILL=executor:12
# (12 fill threads, not 8). First wait_value_probe.py (for the next session). Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-430}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; D=docs/results/s26/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 30 python $D/wait_value_probe.py --out $OUT/wait_value.json 2>&1 | tail -3
structured() {  # $1 label, $2 runner prefix, $3 ASERVE_MASK_FILL
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_MASK_FILL=$3 timeout $L python $2 aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured A1 "-m" ""
structured S1 "$D/serial_advance.py" ""
structured T1 "-m" "executor:12"
structured A2 "-m" ""
structured S2 "$D/serial_advance.py" ""
structured T2 "-m" "executor:12"
date -u; echo "took $(( $(date +%s) - S )) s"
