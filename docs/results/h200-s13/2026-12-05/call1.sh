#!/bin/bash
# Session 13, one call for what matters most: the GPU suite at HEAD; issue 14's served workload with
# step traces (where the device idle goes); issue 15's fused LM head + argmax (branch
# next/head-argmax, tree in .gpu/head): its kernel tests, then the decode step against its floor
# with the kernel off and on.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; H=$ROOT/.gpu/head
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
(cd $H && python setup.py build_ext --inplace > /tmp/bh.txt 2>&1 || cp /tmp/bh.txt $OUT/) &
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/; wait
date -u
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $OUT/gpu_tests.txt
date -u
PYTHONPATH=$ROOT timeout 200 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --trace-dir /tmp/traces --out $OUT/served.json > /tmp/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " /tmp/served.log
for f in /tmp/traces/*.json; do echo "== $f"; PYTHONPATH=$ROOT python -m aserve.bench.trace_gaps $f --top 5; done > $OUT/trace_gaps.txt 2>&1; cut -c1-200 $OUT/trace_gaps.txt | head -50
date -u
cd $H; export PYTHONPATH=$H
timeout 60 python -m pytest -q -m "" tests/kernels/test_head_argmax.py > $OUT/head_tests.txt 2>&1; echo "head tests rc=$?"; tail -1 $OUT/head_tests.txt
for f in 0 1; do
  ASERVE_FUSED_HEAD=$f timeout 80 python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only copy,floor --attention-backend triton --out $OUT/floor_fused$f.json > /tmp/f$f.log 2>&1; echo "fused=$f rc=$?"; grep "floor_ms" /tmp/f$f.log | cut -c1-200
  date -u
done
