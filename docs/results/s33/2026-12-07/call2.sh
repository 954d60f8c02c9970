#!/bin/bash
# Session 33, call 2 (issue 15): the new defaults (PDL on, the decode attention's splits merged
# inline, a head-major KV cache; with call 1's q/k/v prologue a program a token and the rotary
# table in one kernel) against the old ones, taking turns, and Llama's decode attention at 64
# keys a block (ASERVE_DECODE_LAUNCH=64,4,3; 13% ahead alone in call 1). First the tests that
# call 1's stale counters broke, the CUDA engine suite under the new defaults; last the decode
# kernel alone at 16 / 64 / 256 rows, inline merge against the merge kernel. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-360}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 110 python -m pytest -q -m "" tests/attention/test_triton.py tests/gpu/test_step_variants_cuda.py \
  tests/gpu/test_cuda_engine.py > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
OLD="ASERVE_PDL=0 ASERVE_DECODE_MERGE=kernel ASERVE_KV_LAYOUT=token"
t=100
for run in new1 old1 b64_1 new2 old2 b64_2; do
  L=$(left); [ $L -gt 45 ] || { echo "floor $run skipped"; continue; }
  case ${run%_[0-9]} in old*) env="$OLD";; b64) env="ASERVE_DECODE_LAUNCH=64,4,3";; *) env="ASERVE_PDL=1";; esac
  env $env timeout $t python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$run.log; t=45
done
for m in inline kernel; do
  L=$(left); [ $L -gt 25 ] || { echo "sweep $m skipped"; continue; }
  ASERVE_DECODE_MERGE=$m timeout $(( L - 3 )) python -m aserve.bench.decode_kernels --only sweep --batches 16,64,256 \
    --block-n 32 --warps 4 --stages 3 --splits 0 --kv-layouts head --out /tmp/sweep_$m.json 2>&1 | grep -E "^[a-z].*layer" 
done
date -u; echo "took $(( $(date +%s) - S )) s"
