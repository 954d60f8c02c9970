#!/bin/bash
# Session 2026-12-05 #10, call 2: served (issue 14: 3 x 512, 4 front ends) and structured (issue 16) on this host.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD
date -u
timeout 330 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"
grep -A12 "^run  " $OUT/served.log | cut -c1-220
date -u
timeout 150 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured.json > $OUT/structured.txt 2>&1; echo "struct rc=$?"; grep -E "^structured|^ *structured" $OUT/structured.txt | cut -c1-250
date -u
