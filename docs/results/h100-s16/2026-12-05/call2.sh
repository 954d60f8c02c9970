#!/bin/bash
# Session 16, call 2: the persistent decode batch (HEAD) against c3d5801 (.gpu/base), one machine.
# 1. GPU suite at HEAD. 2. Pure host step, both trees. 3. Decode batch 64/256/512, both trees.
# 4. Issue 14's served workload, 4 front ends, HEAD, while time lasts.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/base && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
date -u
PYTHONPATH=$ROOT timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep -E "FAILED|Error" $OUT/gpu_tests.txt | head
for t in base head; do D=$ROOT; [ $t = base ] && D=$ROOT/.gpu/base
  (cd $D && PYTHONPATH=$D python -m aserve.bench.host_step --batches 64,256,512 --steps 200 --out $OUT/host_step_$t.json 2>&1 | tail -4 | sed "s/^/$t /")
done
date -u
for t in base head; do D=$ROOT; [ $t = base ] && D=$ROOT/.gpu/base
  (cd $D && PYTHONPATH=$D timeout 110 python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only batch --batches 64,256,512 --out $OUT/batch_$t.json > /tmp/batch_$t.log 2>&1; echo "batch $t rc=$?"; grep -E "^ *(run|batch) " /tmp/batch_$t.log | cut -c1-170)
done
date -u
LEFT=$(( 575 - ($(date +%s) - S) ))
[ $LEFT -gt 80 ] && PYTHONPATH=$ROOT timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 2 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " $OUT/served.log | cut -c1-215
date -u; echo "took $(( $(date +%s) - S )) s"
