#!/bin/bash
# Session 23, call 3 (issue 16), at the session's last code: the CUDA structured and kernel tests
# (the two masked-argmax tests now share a helper), then one more round of the structured bench,
# graph and eager taking turns. Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 120 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
for t in graph4:1 eager4:0; do
  LEFT=$(( 300 - ($(date +%s) - S) )); [ $LEFT -gt 70 ] || { echo "${t%:*} skipped"; continue; }
  ASERVE_SAMPLER_GRAPH=${t#*:} timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured \
    --batches 64,256 --structured-repeats 3 --out $OUT/structured_${t%:*}.json > /tmp/s.log 2>&1
  echo "structured ${t%:*} rc=$?"; grep "^structured b=" /tmp/s.log
done
echo "took $(( $(date +%s) - S )) s"
