#!/bin/bash
# Session 33, call 2 (issue 15): the new defaults (PDL on, the decode attention's splits merged
# inline, a head-major KV cache; with call 1's q/k/v prologue a program a token and the rotary
# table in one kernel) against the old ones, and Llama's decode attention at 64 keys a block
# (ASERVE_DECODE_LAUNCH=64,4,3; 13% ahead alone in call 1). First the tests that call 1's stale
# counters broke and the step variants under the new defaults. Short: 350 s of device time were
# left. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-240}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 45 python -m pytest -q -m "" tests/attention/test_triton.py -k "configurations or head_major" \
  tests/gpu/test_step_variants_cuda.py tests/gpu/test_pdl_cuda.py > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
OLD="ASERVE_PDL=0 ASERVE_DECODE_MERGE=kernel ASERVE_KV_LAYOUT=token"
t=90
for run in new1 old1 b64_1; do
  L=$(left); [ $L -gt 28 ] || { echo "floor $run skipped"; continue; }
  case ${run%_[0-9]} in old*) env="$OLD";; b64) env="ASERVE_DECODE_LAUNCH=64,4,3";; *) env="ASERVE_PDL=1";; esac
  env $env timeout $(( t < L ? t : L )) python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$run.log; t=40
done
date -u; echo "took $(( $(date +%s) - S )) s"
