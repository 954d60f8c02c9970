#!/bin/bash
# Session 33, call 1 (issue 15): programmatic dependent launch's second measurement, and the
# q/k/v prologue with a token's heads in one program (ASERVE_QKV_HEADS=1: a program per head,
# as before). The kernels' tests under PDL, the floor in three triples taking turns, the
# step's kernels on both shapes, then decode runs at 64 / 256 / 512 with and without PDL.
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
ASERVE_PDL=1 timeout 150 python -m pytest -q -m "" tests/gpu/test_pdl_cuda.py tests/kernels/test_fused.py tests/attention \
  tests/kernels/test_bitmask.py tests/gpu/test_cuda_engine.py > $OUT/tests_pdl.txt 2>&1
echo "tests under ASERVE_PDL=1 rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests_pdl.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests_pdl.txt | head -6
for run in base1 pdl1 qkv1 base2 pdl2 qkv2 base3 pdl3; do
  L=$(left); [ $L -gt 200 ] || { echo "floor $run skipped"; continue; }
  case ${run%[0-9]} in pdl) env="ASERVE_PDL=1";; qkv) env="ASERVE_QKV_HEADS=1";; *) env="ASERVE_PDL=0";; esac
  env $env timeout 60 python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$run.log
done
L=$(left); [ $L -gt 120 ] && timeout 110 python -m aserve.bench.decode_kernels --only step --out $OUT/step.json 2>&1 | grep -v "request_end\|^{\|^20" | tail -44
echo "step profile after $(( $(date +%s) - S )) s"
for run in base pdl; do
  L=$(left); [ $L -gt 50 ] || { echo "batch $run skipped"; continue; }
  p=0; [ $run = pdl ] && p=1
  ASERVE_PDL=$p timeout $(( L - 10 )) python -m aserve.bench.device_bench --only batch --batches 64,256,512 \
    --out $OUT/batch_$run.json > /tmp/batch_$run.log 2>&1
  echo "== batch $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_$run.log | tail -7
done
date -u; echo "took $(( $(date +%s) - S )) s"
