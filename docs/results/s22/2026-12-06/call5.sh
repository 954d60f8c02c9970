#!/bin/bash
# Session 22, call 5 (issue 16), at the session's last code (the grammar job reverted; the
# recorded ends and advance_all's shorter Python kept): the CUDA structured tests and the
# kernel's, then the structured bench once (the standing figure on this host).
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 120 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -2 $OUT/gpu_tests.txt
LEFT=$(( 300 - ($(date +%s) - S) ))
[ $LEFT -gt 80 ] && { timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured \
  --batches 64,256 --structured-repeats 3 --out $OUT/structured.json > /tmp/structured.log 2>&1
  echo "structured rc=$? rejected=$(grep -c grammar_rejected /tmp/structured.log)"; grep "^structured b=" /tmp/structured.log; }
date -u; echo "took $(( $(date +%s) - S )) s"
