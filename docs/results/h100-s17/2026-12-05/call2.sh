#!/bin/bash
# Session 17, call 2: the GPU suite at HEAD (the table writes now derived on the device), the
# prefill step's host time (5894ff3 vs HEAD), the served path at the default front ends and at 4,
# the decode run and W1 at the defaults.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/base && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
date -u
timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep -E "FAILED|Error" $OUT/gpu_tests.txt | head
for t in base head base head; do if [ $t = base ]; then P=$ROOT/.gpu/base; else P=$ROOT; fi; echo -n "$t: "; (cd /tmp && PYTHONPATH=$P python $ROOT/.gpu/prefill_steps.py); done 2>&1 | tee $OUT/prefill_steps.txt
LEFT=$(( 470 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers default,4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A12 "^run  " $OUT/served.log | cut -c1-215
LEFT=$(( 540 - ($(date +%s) - S) ))
[ $LEFT -gt 40 ] && timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only batch --batches 64,256,512 --out $OUT/batch.json > /tmp/batch.log 2>&1; echo "batch rc=$?"; grep -E "^ *(run|batch) " /tmp/batch.log | cut -c1-170
LEFT=$(( 590 - ($(date +%s) - S) ))
[ $LEFT -gt 25 ] && timeout $LEFT python .gpu/w1_timeline.py $OUT/w1.json 2>&1 | grep -E "tok/s|steps"
date -u; echo "took $(( $(date +%s) - S )) s"
