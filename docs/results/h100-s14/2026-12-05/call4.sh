#!/bin/bash
# Session 14, call 4: the embedded engine alone, poll against spin, taking turns (is spin slower
# for the engine in process, as call 3 suggested?); then the served workload with spin at 4 and
# 6 front ends.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
for w in poll spin poll spin; do
  timeout 70 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers "" --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --engine-opt cuda_event_wait=$w --out /tmp/engine_$w.json > /tmp/engine_$w.log 2>&1; echo "engine $w rc=$?"; grep "engine.complete" /tmp/engine_$w.log
  cat /tmp/engine_$w.json >> $OUT/engine_ab.jsonl; echo >> $OUT/engine_ab.jsonl
done
date -u
timeout 150 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --engine-opt cuda_event_wait=spin --out $OUT/served_spin_w4.json > /tmp/served.log 2>&1; echo "served rc=$?"; grep -A12 "^run  " /tmp/served.log
date -u
