#!/bin/bash
# Session 2026-12-05 #10, call 1: GPU tests at HEAD (first since 368d402), the decode floor, batch 256/512, W1 timeline.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD
date -u; nproc; lscpu | grep -E "Model name" | head -1
timeout 240 python -m pytest -m "" -q tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/gpu_tests.txt
date -u
timeout 120 python -m aserve.bench.device_bench --only copy,floor --attention-backend triton --out $OUT/floor.json > $OUT/floor.txt 2>&1; echo "floor rc=$?"; tail -8 $OUT/floor.txt | cut -c1-250
date -u
timeout 110 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > $OUT/batch.txt 2>&1; echo "batch rc=$?"; tail -3 $OUT/batch.txt | cut -c1-300
date -u
timeout 90 python .gpu/w1_timeline.py $OUT/w1_timeline.json > $OUT/w1_timeline.log 2>&1; echo "w1 rc=$?"
python .gpu/analyze_timeline.py $OUT/w1_timeline.json | head -4
date -u
