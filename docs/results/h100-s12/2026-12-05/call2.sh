#!/bin/bash
# Session 2026-12-05 #12, call 2: after the background fill's revert: the GPU suite at HEAD, the
# structured bench at HEAD and at 8ca9f87 (same defaults), then a cProfile of the loop thread over
# a constrained batch-256 run at HEAD. Each its own process.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD
nproc; lscpu | grep "Model name"; nvidia-smi --query-gpu=name --format=csv,noheader
(cd .gpu/base8ca && python setup.py build_ext --inplace > /tmp/build_ext_base.txt 2>&1 || cp /tmp/build_ext_base.txt $OUT/; echo "build_ext base done") &
python setup.py build_ext --inplace > /tmp/build_ext.txt 2>&1 || cp /tmp/build_ext.txt $OUT/; echo "build_ext done"; wait
export PYTHONPATH=$ROOT
date -u
timeout 150 python -m pytest -q -m "" -x tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.txt
date -u
timeout 85 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/struct_head.json > $OUT/struct_head.log 2>&1; echo "struct head rc=$?"; grep -E "^structured" $OUT/struct_head.log | cut -c1-250
date -u
(cd .gpu/base8ca && PYTHONPATH=$ROOT/.gpu/base8ca timeout 85 python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --out $OUT/struct_base8ca.json > $OUT/struct_base8ca.log 2>&1; echo "struct base rc=$?"; grep -E "^structured" $OUT/struct_base8ca.log | cut -c1-250)
date -u
timeout 90 python -m aserve.bench.device_bench --only structured,profile --batches 256 --profile-batch 64 --out $OUT/profile.json > $OUT/profile.log 2>&1; echo "profile rc=$?"; grep -E "^structured" $OUT/profile.log | cut -c1-250
date -u
