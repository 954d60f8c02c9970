#!/bin/bash
# Session 33, call 1 (issue 15): three changes to the decode step, each against the defaults in
# the same process order, taking turns: programmatic dependent launch (ASERVE_PDL=1, its
# second measurement), the q/k/v prologue with a token's heads in one program (the default
# now; ASERVE_QKV_HEADS=1 is the old program per head), the rotary table in one kernel (the
# default now; ASERVE_ROPE=torch is torch's eight ops), a head-major KV cache
# (ASERVE_KV_LAYOUT=head), and the decode attention's splits merged by their last program
# (ASERVE_DECODE_MERGE=inline). First the tests of all three on the device, the decode kernel alone
# in both cache orders, then the floors, then the step's kernels on both shapes.
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
ASERVE_PDL=1 timeout 120 python -m pytest -q -m "" tests/gpu/test_pdl_cuda.py tests/gpu/test_step_variants_cuda.py \
  tests/kernels/test_fused.py tests/attention tests/kernels/test_bitmask.py > $OUT/tests_pdl.txt 2>&1
echo "tests under ASERVE_PDL=1 rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests_pdl.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests_pdl.txt | head -6
timeout 60 python -m aserve.bench.decode_kernels --only sweep --shapes llama3.2-1b --block-n 32,64 --warps 4 \
  --stages 3 --splits 0 --kv-layouts token,head --out $OUT/sweep_layouts.json 2>&1 | grep -v "^{" | tail -40
echo "sweep after $(( $(date +%s) - S )) s"
for run in base1 pdl1 qkv1 rope1 head1 merge1 base2 pdl2 qkv2 rope2 head2 merge2; do
  L=$(left); [ $L -gt 100 ] || { echo "floor $run skipped"; continue; }
  case ${run%[0-9]} in pdl) env="ASERVE_PDL=1";; qkv) env="ASERVE_QKV_HEADS=1";; rope) env="ASERVE_ROPE=torch";; head) env="ASERVE_KV_LAYOUT=head";; merge) env="ASERVE_DECODE_MERGE=inline";; *) env="ASERVE_PDL=0";; esac
  env $env timeout 60 python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$run.log
done
L=$(left); [ $L -gt 60 ] && timeout $(( L - 5 )) python -m aserve.bench.decode_kernels --only step --out $OUT/step.json 2>&1 | grep -v "request_end\|^{\|^20" | tail -44
date -u; echo "took $(( $(date +%s) - S )) s"
