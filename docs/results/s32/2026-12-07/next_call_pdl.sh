#!/bin/bash
# Prepared for the next session (issue 15), not run: programmatic dependent launch's second
# measurement. Session 32's one pair had the decode graph's replay 3.0% / 1.1% shorter with
# ASERVE_PDL=1 (Gemma 3 270M / Llama 3.2 1B shapes, 256 rows) but that run's Gemma steps
# spanning longer (1.99 against 1.93 ms). Here: the kernels' tests under PDL, then the floor in
# three pairs taking turns, then decode runs at 64 / 256 / 512 on both shapes with and without
# it (the device's median step and the steady idle: the span question). Turn PDL on by default
# only if the runs' steps, not only the replays, are shorter. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
ASERVE_PDL=1 timeout 150 python -m pytest -q -m "" tests/gpu/test_pdl_cuda.py tests/attention tests/kernels/test_bitmask.py tests/gpu/test_cuda_engine.py > $OUT/tests_pdl.txt 2>&1
echo "tests under ASERVE_PDL=1 rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests_pdl.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests_pdl.txt | head -6
for run in base1 pdl1 base2 pdl2 base3 pdl3; do
  L=$(left); [ $L -gt 40 ] || { echo "floor $run skipped"; continue; }
  p=0; [ ${run%[0-9]} = pdl ] && p=1
  ASERVE_PDL=$p timeout $L python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$run.log
done
for run in base pdl; do
  L=$(left); [ $L -gt 60 ] || { echo "batch $run skipped"; continue; }
  p=0; [ $run = pdl ] && p=1
  ASERVE_PDL=$p timeout $L python -m aserve.bench.device_bench --only batch --batches 64,256,512 --batch-shapes gemma,llama \
    --out $OUT/batch_$run.json > /tmp/batch_$run.log 2>&1
  echo "== batch $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_$run.log | tail -7
done
date -u; echo "took $(( $(date +%s) - S )) s"
