#!/bin/bash
# Session 2026-12-05 #12, call 3: the GPU suite with the runner entering its streams through
# aserve/device/streams.py (on_stream) instead of torch.cuda.stream.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD
date -u
timeout 170 python -m pytest -q -m "" -x tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.txt
date -u
