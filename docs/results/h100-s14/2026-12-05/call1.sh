#!/bin/bash
# Session 14, call 1: issue 14's served workload with the client processes started together
# (8 by default on 16 cores), 4 and 7 front ends, CPU shares per run and top; the front end's
# capacity on this host; then the GPU suite at HEAD in what time is left.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; lscpu | grep "Model name"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
(top -b -d 1 -n 400 -c -w 200 | grep -E "^top|python|aserve" > /tmp/top.txt) & TOP=$!
timeout 330 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4,7 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A12 "^run  " $OUT/served.log
kill $TOP; awk '/^top/{n++} n>0' /tmp/top.txt | grep -E "loadgen|aserve|^top" | awk '{print $9, $12, $13, $14, $15, $16}' | head -c 400000 > $OUT/top.txt
python - <<'PY'
import json
d = json.load(open("/tmp/dummy" if False else __import__("os").environ["OUT"] + "/served.json"))
for r in d["rows"]:
    print(f'{r["label"]:<40} lag p99 {r.get("client_loop_lag_p99_ms", float("nan")):7.1f} ms  ready spread {r.get("client_ready_spread_ms", float("nan")):7.1f} ms  core {r.get("core_busy", float("nan")):.2f}  FEs {[round(c / 1, 1) for c in r.get("children_cpu_s", [])]}')
PY
date -u
timeout 60 python -m aserve.bench.front_end --tokenizer-dir .gpu --streams 64,256 --tokens 256 --client-procs 2 --out $OUT/front_end.json 2>&1 | tail -5
date -u
LEFT=$(( 585 - ($(date +%s) - S) ))
echo "gpu suite gets ${LEFT}s"
[ $LEFT -gt 30 ] && timeout $LEFT python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
date -u
