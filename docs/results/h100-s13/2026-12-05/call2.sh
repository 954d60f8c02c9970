#!/bin/bash
# Session 13, call 2: the served workload without traces, HEAD against f30835a (the tenth session's
# build, 0.85-0.89x then), each with its own bench, one after the other; the host's CPU topology and
# a snapshot of the processes while HEAD's served runs go.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|Thread\(s\)|Core\(s\)|Socket\(s\)|^CPU\(s\)|NUMA node\(s\)"
(cd .gpu/old && python setup.py build_ext --inplace > /tmp/bo.txt 2>&1 || cp /tmp/bo.txt $OUT/) &
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/; wait
date -u
(sleep 50; for i in 1 2 3 4 5 6 7; do date -u; top -b -n 1 -w 200 | head -28; sleep 8; done > $OUT/top_during_served.txt 2>&1) &
PYTHONPATH=$ROOT timeout 125 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served_head.json > /tmp/sh.log 2>&1; echo "served HEAD rc=$?"; grep -A8 "^run  " /tmp/sh.log; grep -E "^client:|^ *client:" /tmp/sh.log | cut -c1-120; cp /tmp/sh.log $OUT/served_head.log
date -u
(cd .gpu/old && PYTHONPATH=$ROOT/.gpu/old timeout 125 python -m aserve.bench.served --tokenizer-dir $ROOT/.gpu --api-workers 4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served_f30835a.json > /tmp/so.log 2>&1; echo "served f30835a rc=$?"; grep -A8 "^run  " /tmp/so.log; grep -E "^client:|^ *client:" /tmp/so.log | cut -c1-120; cp /tmp/so.log $OUT/served_f30835a.log)
date -u
