#!/bin/bash
# Session 2026-12-04 #4, call 5: issue 14's served workload after the prefill graphs (engine.complete, serve --api-workers 0 and 4, W3).
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
timeout 450 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 0,4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 1 --rates 8,32,128 --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"
tail -30 $OUT/served.log | cut -c1-200
date -u
