#!/bin/bash
# Session 25, call 1 (issue 16): a split step's masks copied on the schedule stream beside the
# forward (DecodeGraphs.upload_masks, restored from session 24's 7f2e0d6) instead of inside the
# masked-argmax graph after it. 1. the structured CUDA tests; 2. the copy's own rate (copy_rate.py);
# 3. the structured bench, taking turns: N (the tree), O (s24's masks_in_line.py: the copy back on
# the forward stream before the replay) and T (masks_two_streams.py: N's copy in two halves on two
# streams); 4. torch.profiler at 256 rows, if time is left. Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-560}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s24/2026-12-06; D=docs/results/s25/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 90 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
timeout 60 python $D/copy_rate.py --out $OUT/copy_rate.json
structured() {  # $1 label, $2 runner prefix
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  timeout $L python $2 aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured N1 "-m"
structured O1 "$R/masks_in_line.py"
structured T1 "$D/masks_two_streams.py"
structured N2 "-m"
structured O2 "$R/masks_in_line.py"
structured T2 "$D/masks_two_streams.py"
L=$(left); if [ $L -gt 60 ]; then
  timeout $L python $R/device_profile.py --tokenizer-dir .gpu --batch 256 --out $OUT/profile256.json 2>&1 | grep -v "^20..-"
fi
date -u; echo "took $(( $(date +%s) - S )) s"
