#!/bin/bash
# Prepared in session 16 for the next session's first device call (ask for nvidia-h200; carry
# [".gpu", ".whl"]; build .whl and .gpu/tokenizer.model as ../shared/device.md says; copy
# w1_timeline.py from docs/results/h100-s16/2026-12-05/ to .gpu/).
# 1. The GPU suite at HEAD (not run since the direct launch was reverted and the review fixes
# landed). 2. Issue 14's served workload, 3 x 512. 3. The decode batch section. 4. W1 timeline.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep -E "FAILED|Error" $OUT/gpu_tests.txt | head
LEFT=$(( 420 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4,7 --requests 512 --concurrency 256 --len 256 --repeats 2 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " $OUT/served.log | cut -c1-215
LEFT=$(( 520 - ($(date +%s) - S) ))
[ $LEFT -gt 40 ] && timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only batch --batches 64,256,512 --out $OUT/batch.json > /tmp/batch.log 2>&1; echo "batch rc=$?"; grep -E "^ *(run|batch) " /tmp/batch.log | cut -c1-170
LEFT=$(( 585 - ($(date +%s) - S) ))
[ $LEFT -gt 30 ] && timeout $LEFT python .gpu/w1_timeline.py $OUT/w1.json 2>&1 | grep -E "tok/s|steps"
date -u; echo "took $(( $(date +%s) - S )) s"
