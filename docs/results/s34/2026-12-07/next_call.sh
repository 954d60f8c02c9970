#!/bin/bash
# Prepared in session 34 (issue 15), not run: the H200 (the bars' machine) for what this
# session measured on an H100 host only. Two pipeline stages for the decode kernel over heads
# of 64 in launches of 2,048+ programs (decode_stages, `ea2ef87`; Llama's step -8.5% there)
# against three (ASERVE_DECODE_LAUNCH=32,4,3, the old launch), taking turns; 128 keys with two
# stages (on par on the H100); Gemma's decode kernel alone over launch configurations (heads of
# 256: three stages ahead in the H100's step); decode runs at 64 / 256 / 512 rows on both shapes,
# new against old. Then, as a second call, W1 for the Llama bar:
# `bash docs/results/s25/2026-12-06/w1_llama.sh` (~560 s). Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-480}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/gpu tests/attention > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
t=90
for run in new1 old1 b128_1 new2 old2 b128_2; do
  [ $(left) -gt 200 ] || { echo "floor $run skipped"; continue; }
  case $run in old*) env="ASERVE_DECODE_LAUNCH=32,4,3";; b128*) env="ASERVE_DECODE_LAUNCH=128,4,2";; *) env="ASERVE_PDL=1";; esac
  env $env timeout $t python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out /tmp/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$run.log; t=45
done
[ $(left) -gt 160 ] && timeout 45 python -m aserve.bench.decode_kernels --only sweep --shapes gemma3-270m \
  --block-n 16,32,64 --warps 4,8 --stages 2,3 --splits 0,1 --kv-layouts head --out /tmp/sweep_gemma.json 2>&1 | grep -v "^{" | tail -14
for run in new old; do
  L=$(left); [ $L -gt 60 ] || { echo "batch $run skipped"; continue; }
  env=""; [ $run = old ] && env="ASERVE_DECODE_LAUNCH=32,4,3"
  env $env timeout $(( L - 5 )) python -m aserve.bench.device_bench --only batch --batches 64,256,512 \
    --batch-shapes gemma,llama --out /tmp/batch_$run.json > /tmp/batch_$run.log 2>&1
  echo "== batch $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_$run.log | tail -8
done
(cd /tmp && tar czf $OUT/rest.tgz floor_* batch_* sweep_gemma.json 2>/dev/null)
date -u; echo "took $(( $(date +%s) - S )) s"
