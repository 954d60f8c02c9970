#!/bin/bash
# Session 16, call 4: HEAD (decode batch, mixed-step columns, direct graph launch, send loops
# behind the planner) against c3d5801 (.gpu/base), one machine. 1. GPU suite at HEAD. 2. Pure
# host step. 3. Decode batch 64/256/512: HEAD, HEAD with ASERVE_DIRECT_GRAPH_LAUNCH=0, base.
# 4. Issue 14's served workload, 4 front ends, HEAD. 5. W1 timeline (Gemma, defaults), HEAD.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/base && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
date -u
PYTHONPATH=$ROOT timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep -E "FAILED|Error" $OUT/gpu_tests.txt | head
PYTHONPATH=$ROOT python -m aserve.bench.host_step --batches 64,256,512 --steps 200 --out $OUT/host_step.json 2>&1 | tail -4
date -u
batch() {  # $1 label, $2 tree, then env
  local t=$1 D=$2; shift 2
  (cd $D && env PYTHONPATH=$D "$@" timeout 100 python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only batch --batches 64,256,512 --out $OUT/batch_$t.json > /tmp/batch_$t.log 2>&1; echo "batch $t rc=$?"; grep -E "^ *(run|batch) " /tmp/batch_$t.log | cut -c1-170)
}
batch head $ROOT ASERVE_X=1
batch head_general $ROOT ASERVE_DIRECT_GRAPH_LAUNCH=0
batch base $ROOT/.gpu/base ASERVE_X=1
date -u
LEFT=$(( 500 - ($(date +%s) - S) ))
[ $LEFT -gt 80 ] && PYTHONPATH=$ROOT timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 2 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " $OUT/served.log | cut -c1-215
date -u
LEFT=$(( 585 - ($(date +%s) - S) ))
[ $LEFT -gt 40 ] && PYTHONPATH=$ROOT timeout $LEFT python .gpu/w1_timeline.py $OUT/w1_head.json 2>&1 | grep -E "tok/s|steps"
gzip -f $OUT/w1_*.json 2>/dev/null
date -u; echo "took $(( $(date +%s) - S )) s"
