#!/bin/bash
# Session 24, call 3 (issue 16): 1. the structured CUDA tests with the fill beside the commit;
# 2. host_step (no device work) on this host: the commit's advance on the pool (from 128 rows,
# the tree's) against one by one, taking turns; 3. the structured bench: A beside (the new
# default), B ASERVE_FILL_BESIDE=0 (the tree before), C beside + the advance one by one.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s24/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 150 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/sampling/test_fill_masks.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
for t in pool:128 serial:1000000000 pool2:128 serial2:1000000000; do
  timeout 60 python $R/advance_rows.py ${t#*:} aserve.bench.host_step --constrained --tokenizer-dir .gpu --batches 64,256 \
    --out $OUT/host_step_${t%:*}.json 2>&1 | grep -A3 "^ batch" | sed "s/^/${t%:*} /"
done
structured() {  # $1 label, $2 ASERVE_FILL_BESIDE, $3 pool advance rows
  local t=$1
  LEFT=$(( 590 - ($(date +%s) - S) ))
  [ $LEFT -gt 90 ] || { echo "structured $t skipped: $LEFT s left"; return; }
  ASERVE_FILL_BESIDE=$2 timeout $LEFT python $R/advance_rows.py $3 aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured A1 1 128
structured B1 0 128
structured C1 1 1000000000
date -u; echo "took $(( $(date +%s) - S )) s"
