#!/bin/bash
# Session 18, call 1: issue 14's figures at HEAD in one call: the served workload at the default
# front ends against one process and engine.complete (3 x 512), W3 at 8/32/128 req/s and saturated;
# then the one-client-process setup the issue saw fail.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python -c "import torch; print(torch.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 430 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default,0 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates 8,32,128,512 --w3-requests 200 --out $OUT/served_w3.json > $OUT/served_w3.log 2>&1; echo "served rc=$?"; grep -A14 "^run  " $OUT/served_w3.log | cut -c1-215
LEFT=$(( 570 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default --client-procs 1 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served_1client.json > $OUT/served_1client.log 2>&1; echo "served 1 client rc=$?"; grep -A8 "^run  " $OUT/served_1client.log | cut -c1-215
date -u; echo "took $(( $(date +%s) - S )) s"
