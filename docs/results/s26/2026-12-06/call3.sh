#!/bin/bash
# Session 26, call 3 (issue 16): a split step's masks copied as their distinct rows and an index
# (DecodeGraphs.upload_masks, distinct_masks). 1. the structured CUDA tests, the bitmask kernels
# and distinct_masks; 2. distinct_masks' own cost here (dedup_time.py); 3. upload_events.py at 256
# and 64 rows, timeline.py at 256; 4. the structured bench taking turns: D (distinct masks) and F
# (ASERVE_DISTINCT_MASKS=0: every row, as in calls 1-2). Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-420}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; D=docs/results/s26/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py tests/sampling/test_distinct_masks.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
timeout 60 python $D/dedup_time.py --out $OUT/dedup_time.json
for b in 256 64; do
  timeout 90 python $D/upload_events.py --tokenizer-dir .gpu --batch $b --out $OUT/upload$b.json 2>&1 | grep -E "^b=|Error|error" | tail -3
done
timeout 90 python $D/timeline.py --tokenizer-dir .gpu --batch 256 --out $OUT/timeline256.json 2>&1 | grep -v "^20..-" | tail -25
structured() {  # $1 label, $2 ASERVE_DISTINCT_MASKS
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_DISTINCT_MASKS=$2 timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured D1 1
structured F1 0
structured D2 1
structured F2 0
date -u; echo "took $(( $(date +%s) - S )) s"
