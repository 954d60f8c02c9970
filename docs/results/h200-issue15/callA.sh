#!/bin/bash
# Issue 15, call A: GPU tests; host step, decode batches and engine-after-engine before (.base = b7b2806) and after (HEAD); floors; W2.
root=$PWD
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.txt
python -m aserve.bench.host_step --out $OUT/host_step_after.json
(cd .base && PYTHONPATH=$PWD python $root/aserve/bench/host_step.py --out $OUT/host_step_before.json 2>&1 | tail -4)
# checkpoint for the engine runs
python -c "from pathlib import Path; from aserve.bench.checkpoints import build_checkpoint; build_checkpoint('gemma3-270m', Path('/tmp/aserve-bench'), Path('.gpu'))" 2>&1 | tail -1
echo "== batch before"; (cd .base && PYTHONPATH=$PWD timeout 200 python $root/.gpu/batch_run.py $OUT/batch_before.json $root/.gpu 2>&1 | grep "^b=")
echo "== batch after"; timeout 200 python .gpu/batch_run.py $OUT/batch_after.json .gpu 2>&1 | grep "^b="
echo "== engines before"; (cd .base && PYTHONPATH=$PWD timeout 150 python $root/.gpu/engines.py $OUT/engines_before.json 2>&1 | grep "engine \|min/")
echo "== engines after"; timeout 150 python .gpu/engines.py $OUT/engines_after.json 2>&1 | grep "engine \|min/\|batch_sizes" | cut -c1-400
echo "== floor + w2"; timeout 300 python -m aserve.bench.device_bench --only copy,floor,w2 --tokenizer-dir .gpu --out $OUT/floor_w2.json 2>&1 | tail -12
date -u
