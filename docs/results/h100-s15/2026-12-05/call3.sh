#!/bin/bash
# Session 15, call 3: the whole GPU suite at HEAD (spin the default, the cuBLAS workspace fix,
# the stats' window medians), then structured against free at 64 and 256 with each way of
# awaiting CUDA events (does spinning on the loop's thread starve the mask fill?).
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; lscpu | grep -E "Model name"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
git log --oneline -1 2>/dev/null
date -u
timeout 240 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep FAILED $OUT/gpu_tests.txt
date -u
for mode in spin poll thread; do
  LEFT=$(( 580 - ($(date +%s) - S) )); [ $LEFT -lt 40 ] && break
  timeout $LEFT python -m aserve.bench.device_bench --only structured --batches 64,256 --engine-opt cuda_event_wait=$mode --out $OUT/structured_$mode.json > /tmp/s_$mode.log 2>&1; echo "structured $mode rc=$?"; grep -E "^structured" /tmp/s_$mode.log | cut -c1-200
done
date -u
