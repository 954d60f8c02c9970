#!/bin/bash
# Session 2026-12-05 #10, call 3: served with 0 / 4 / 8 front ends, 2 x 512 each, and W3 at 8/32/128 req/s (issue 14).
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD
date -u
timeout 520 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 0,4,8 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 2 --rates 8,32,128 --w3-requests 200 --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"
grep -A40 "^run  " $OUT/served.log | cut -c1-220
date -u
