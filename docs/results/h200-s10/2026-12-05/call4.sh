#!/bin/bash
# Session 2026-12-05 #10, call 4: the GPU suite and the sampler tests (CPU and CUDA) at the session's last code.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD
date -u; git log --oneline -1 2>/dev/null
timeout 300 python -m pytest -m "" -q tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py tests/sampling -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/gpu_tests.txt
date -u
