#!/bin/bash
# Session 24, call 5 (issue 16): a split step's masks copied on the schedule stream beside the
# forward (DecodeGraphs.upload_masks) instead of inside the masked-argmax graph after it.
# 1. the structured CUDA tests; 2. the structured bench, N (the change) and O (masks_in_line.py:
# the copy on the forward stream before the replay, as before) taking turns; 3. if time is
# left, torch.profiler at 256 rows, free and constrained, and the masks' copy alone.
# BUDGET: seconds this script may take (the session's device time was nearly spent).
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-280}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s24/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 60 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 runner prefix
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  timeout $L python $2 aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured N1 "-m"
structured O1 "$R/masks_in_line.py"
L=$(left); if [ $L -gt 60 ]; then
  timeout $L python $R/device_profile.py --tokenizer-dir .gpu --batch 256 --out $OUT/profile256.json 2>&1 | grep -v "^20..-"
fi
structured N2 "-m"
structured O2 "$R/masks_in_line.py"
date -u; echo "took $(( $(date +%s) - S )) s"
