#!/bin/bash
# Session 17, call 3: issue 14's W3 at the default front ends against one process (same call),
# with the 3 x 512 served runs again; then issue 16's structured bench at HEAD.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 420 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default,0 --requests 512 --concurrency 256 --len 256 --repeats 2 --rates 8,32,512 --w3-requests 200 --out $OUT/served_w3.json > $OUT/served_w3.log 2>&1; echo "served rc=$?"; grep -A12 "^run  " $OUT/served_w3.log | cut -c1-215
# The original dropped-stream setup: one client process, 256 streams at once, 3 x 512.
LEFT=$(( 500 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default --client-procs 1 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served_1client.json > $OUT/served_1client.log 2>&1; echo "served 1 client rc=$?"; grep -A8 "^run  " $OUT/served_1client.log | cut -c1-215
LEFT=$(( 575 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured --batches 64,256 --out $OUT/structured.json > $OUT/structured.log 2>&1; echo "structured rc=$?"; grep -iE "structured|constrained|free|ratio" $OUT/structured.log | tail -8 | cut -c1-200
date -u; echo "took $(( $(date +%s) - S )) s"
