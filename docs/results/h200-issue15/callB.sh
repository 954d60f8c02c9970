#!/bin/bash
# Issue 15, call B: decode batches and engine-after-engine after (HEAD); W1 Gemma shape at the defaults, fair peer.
root=$PWD
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
date -u
python -c "from pathlib import Path; from aserve.bench.checkpoints import build_checkpoint; build_checkpoint('gemma3-270m', Path('/tmp/aserve-bench'), Path('.gpu'))" 2>&1 | tail -1
echo "== batch after"; PYTHONPATH=$root timeout 200 python .gpu/batch_run.py $OUT/batch_after.json .gpu > $OUT/batch_after.log 2>&1; grep "^b=\|Error" $OUT/batch_after.log | tail -5
echo "== engines after"; PYTHONPATH=$root timeout 150 python .gpu/engines.py $OUT/engines_after.json > $OUT/engines_after.log 2>&1; grep "engine \|min/\|Error" $OUT/engines_after.log | tail -8
grep -m1 -o "batch_sizes=[^=]*max_running_requests [0-9]* ([^)]*)" $OUT/engines_after.log
echo "== W1 gemma"; timeout 420 python -m aserve.bench.device_bench --only w1 --w1-shapes gemma --w1-requests 1000 --tokenizer-dir .gpu --out $OUT/w1_gemma.json > $OUT/w1_gemma.log 2>&1; echo rc=$?
grep "^W1\|Error" $OUT/w1_gemma.log | tail -3
date -u
