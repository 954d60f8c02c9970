#!/bin/bash
# Prepared in session 18, not run (calls 4-7 were refused: no machine could be started; the budget ran out).
# Session 18, call 5: issue 14's figures (call 1's served workload and W3) again, on whatever
# machine the device lends after call 4 was refused (status then offered an H200).
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python -c "import torch; print(torch.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 300 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default,0 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates 8,32,128,512 --w3-requests 200 --out $OUT/served_w3.json > $OUT/served_w3.log 2>&1; echo "served rc=$?"; grep -A14 "^run  " $OUT/served_w3.log | cut -c1-215; grep "^W3" $OUT/served_w3.log
date -u; echo "took $(( $(date +%s) - S )) s"
