#!/bin/bash
# Session 35 (issue 15): call 2 cut to the device time left (~300 s): the split-K path's GPU
# tests; one floor run with split-K and one without (ASERVE_SPLIT_K=0); decode runs at 64 rows
# (where the rule uses split-K on both shapes), both settings. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-300}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 100 python -m pytest -q -m "" tests/gpu/test_split_k_cuda.py tests/kernels/test_linear.py \
  tests/kernels/test_fused.py -k "split_k or linear or add_rmsnorm" > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
t=80
for run in split cublas; do
  [ $(left) -gt 90 ] || { echo "floor $run skipped"; continue; }
  env=ASERVE_SPLIT_K=1; [ $run = cublas ] && env=ASERVE_SPLIT_K=0
  env $env timeout $t python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out /tmp/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== floor $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step|copy" /tmp/floor_$run.log | tail -3; t=45
done
for run in split cublas split2; do
  L=$(left); [ $L -gt 35 ] || { echo "batch $run skipped"; continue; }
  env=ASERVE_SPLIT_K=1; [ $run = cublas ] && env=ASERVE_SPLIT_K=0
  env $env timeout $(( L < 45 ? L - 5 : 40 )) python -m aserve.bench.device_bench --only batch --batches 64 \
    --batch-shapes gemma,llama --out /tmp/batch_$run.json > /tmp/batch_$run.log 2>&1
  echo "== batch $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_$run.log | tail -3
done
(cd /tmp && tar czf $OUT/rest.tgz floor_* batch_* 2>/dev/null)
date -u; echo "took $(( $(date +%s) - S )) s"
