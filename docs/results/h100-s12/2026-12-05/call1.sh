#!/bin/bash
# Session 2026-12-05 #12, the one call (issue 16): structured bench at HEAD with the default fill
# and with executor:8, at 8ca9f87 (before this session) with its default, the GPU suite at HEAD,
# then the host-only mask-fill bench. Each bench its own process.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD
nproc; lscpu | grep "Model name"
(cd .gpu/base8ca && python setup.py build_ext --inplace > $OUT/build_ext_base.txt 2>&1; echo "build_ext base rc=$?") &
python setup.py build_ext --inplace > $OUT/build_ext.txt 2>&1; echo "build_ext rc=$?"; wait; ls aserve/sampling/*.so .gpu/base8ca/aserve/sampling/*.so
export PYTHONPATH=$ROOT
date -u
timeout 85 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/struct_head_default.json > $OUT/struct_head_default.txt 2>&1; echo "struct head default rc=$?"; grep -E "^structured" $OUT/struct_head_default.txt | cut -c1-250
date -u
(cd .gpu/base8ca && PYTHONPATH=$ROOT/.gpu/base8ca timeout 85 python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --out $OUT/struct_base8ca_default.json > $OUT/struct_base8ca_default.txt 2>&1; echo "struct base default rc=$?"; grep -E "^structured" $OUT/struct_base8ca_default.txt | cut -c1-250)
date -u
timeout 150 python -m pytest -q -m "" -x tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.txt
date -u
ASERVE_MASK_FILL=executor:8 timeout 85 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/struct_head_executor8.json > $OUT/struct_head_executor8.txt 2>&1; echo "struct head executor:8 rc=$?"; grep -E "^structured" $OUT/struct_head_executor8.txt | cut -c1-250
date -u
timeout 60 python -m aserve.bench.mask_fill --tokenizer-dir .gpu --rows 64,256 --fills serial,executor:4,executor:8 --repeats 2 --out $OUT/mask_fill.json > $OUT/mask_fill.txt 2>&1; echo "mask_fill rc=$?"; grep -v info $OUT/mask_fill.txt | tail -8
date -u
