#!/bin/bash
# Issue 14 on the H200: the served path vs the in-process engine (HEAD snapshot in .snap).
cd "$(dirname "$0")/.."
root=$PWD
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import zmq, msgspec, structlog, hypercorn; print('deps ok')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
cd .snap
PYTHONPATH=$PWD timeout 560 python -m aserve.bench.served --tokenizer-dir $root/.gpu --api-workers 0,4,8 --client-procs 4 \
  --requests 512 --concurrency 256 --len 256 --repeats 3 --rates 8,32,128 --out $OUT/served.json > $OUT/served.log 2>&1
echo "rc=$?"; tail -20 $OUT/served.log
for f in /tmp/aserve-bench/served-runs/server_w*.log; do echo "== $f"; grep -ci "error\|traceback" $f; done
(cd /tmp/aserve-bench/served-runs && tar -czf $OUT/runs.tgz *.json server_*.log); ls -la $OUT
