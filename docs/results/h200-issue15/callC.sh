#!/bin/bash
# Issue 15 W1 Llama shape (defaults, fair peer) and issue 14's served path after the host-step work.
root=$PWD
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
date -u
echo "== W1 llama"; timeout 290 python -m aserve.bench.device_bench --only w1 --w1-shapes llama --w1-requests 1000 --tokenizer-dir .gpu --out $OUT/w1_llama.json > $OUT/w1_llama.log 2>&1; echo rc=$?
grep "^W1\|Error" $OUT/w1_llama.log | tail -3
date -u
echo "== served"; timeout 270 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 0,4 --client-procs 4 \
  --requests 512 --concurrency 256 --len 256 --repeats 1 --rates 8,32,128 --out $OUT/served.json > $OUT/served.log 2>&1; echo rc=$?
tail -22 $OUT/served.log
date -u
