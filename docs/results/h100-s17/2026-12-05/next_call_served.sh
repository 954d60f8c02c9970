#!/bin/bash
# Prepared in session 17, not run (the device time was spent). Carry [".gpu", ".whl"] as ../shared/device.md says.
# Session 17, call 5: issue 14's served workload at the final HEAD (keep-alive 20 s, heartbeats
# judged on time, grammar tokenizer built before ready), the default front ends, 3 x 512.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 200 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default --requests 512 --concurrency 256 --len 256 --repeats 2 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " $OUT/served.log | cut -c1-215
date -u; echo "took $(( $(date +%s) - S )) s"
