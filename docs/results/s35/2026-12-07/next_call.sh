#!/bin/bash
# Prepared in session 35 (issue 15), not run: for the H200 (the bars' machine), or another H100.
# The whole GPU suite at HEAD (split-K's engine tests and the PDL test after its refactor among
# them); floors at the defaults against ASERVE_SPLIT_K=0 and against three decode stages
# (ASERVE_DECODE_LAUNCH=32,4,3), taking turns; decode runs at 32 / 64 / 128 / 256 / 512 rows with
# and without split-K; the output and down projections alone at 1-256 rows (the rule's edges).
# Then, as a second call, W1 for the Llama bar: `bash docs/results/s25/2026-12-06/w1_llama.sh`.
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 240 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_linear.py tests/kernels/test_fused.py \
  > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
t=90
for run in new1 cublas1 stages1 new2 cublas2; do
  [ $(left) -gt 170 ] || { echo "floor $run skipped"; continue; }
  case $run in cublas*) env="ASERVE_SPLIT_K=0";; stages*) env="ASERVE_DECODE_LAUNCH=32,4,3";; *) env="ASERVE_PDL=1";; esac
  env $env timeout $t python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out /tmp/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step|copy" /tmp/floor_$run.log | tail -3; t=45
done
for run in split cublas; do
  L=$(left); [ $L -gt 60 ] || { echo "batch $run skipped"; continue; }
  env="ASERVE_SPLIT_K=1"; [ $run = cublas ] && env="ASERVE_SPLIT_K=0"
  env $env timeout $(( L < 75 ? L - 5 : 70 )) python -m aserve.bench.device_bench --only batch --batches 32,64,128,256,512 \
    --batch-shapes gemma,llama --out /tmp/batch_$run.json > /tmp/batch_$run.log 2>&1
  echo "== batch $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_$run.log | tail -11
done
[ $(left) -gt 60 ] && timeout $(( $(left) - 10 )) python -m aserve.bench.layer_gemms --gemms o,down --batches 1,8,16,32,48,64,96,128,192,256 \
  --tiles 64x32x128,64x64x128,32x32x128 --splits 1,2,4,8 --out /tmp/layer_gemms.json > /tmp/layer_gemms.log 2>&1
echo "gemms rc=$? after $(( $(date +%s) - S )) s"; tail -42 /tmp/layer_gemms.log
(cd /tmp && tar czf $OUT/rest.tgz floor_* batch_* layer_gemms.* 2>/dev/null)
date -u; echo "took $(( $(date +%s) - S )) s"
