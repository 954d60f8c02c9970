#!/bin/bash
# Prepared in session 15 for the next session's first device call (ask for nvidia-h200; carry
# [".gpu", ".whl"]; build .whl and .gpu/tokenizer.model as ../shared/device.md says).
# 1. The GPU suite (the release test checks a5eb820: closed runners' streams reused). 2. The
# pure host step on this host (against this VM's 406 us at 256). 3. Issue 14's served workload
# with 4 front ends. 4. The batch section at 256 and 512.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 240 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep FAILED $OUT/gpu_tests.txt
python -m aserve.bench.host_step --batches 64,256,512 --steps 200 --out $OUT/host_step.json 2>&1 | tail -4
date -u
LEFT=$(( 480 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " $OUT/served.log | cut -c1-215
LEFT=$(( 585 - ($(date +%s) - S) ))
[ $LEFT -gt 40 ] && timeout $LEFT python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > /tmp/b.log 2>&1; echo "batch rc=$?"; grep -E "^ *(run|batch) " /tmp/b.log | cut -c1-170
date -u
