#!/bin/bash
# Session 35 (issue 15), for the H200 (the bars' machine): session 34's prepared call, cut to
# fit one call beside a W1 run. The GPU suite (with the new Triton GEMM's tests); the floors with
# the stage rule (`ea2ef87`) against three stages (ASERVE_DECODE_LAUNCH=32,4,3), taking turns;
# the layer GEMMs alone, cuBLAS against the Triton GEMM with and without split-K
# (aserve.bench.layer_gemms); decode runs at 64 / 256 / 512 rows with the defaults if time is
# left. Then W1 for the Llama bar as a second call. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-500}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_linear.py > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
t=90
for run in new1 old1 new2 old2; do
  [ $(left) -gt 200 ] || { echo "floor $run skipped"; continue; }
  case $run in old*) env="ASERVE_DECODE_LAUNCH=32,4,3";; *) env="ASERVE_PDL=1";; esac
  env $env timeout $t python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out /tmp/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step|copy" /tmp/floor_$run.log | tail -3; t=45
done
[ $(left) -gt 110 ] && timeout 100 python -m aserve.bench.layer_gemms --out /tmp/layer_gemms.json > /tmp/layer_gemms.log 2>&1
echo "gemms rc=$? after $(( $(date +%s) - S )) s"; tail -26 /tmp/layer_gemms.log
L=$(left); if [ $L -gt 70 ]; then
  timeout $(( L - 8 )) python -m aserve.bench.device_bench --only batch --batches 64,256,512 \
    --batch-shapes gemma,llama --out /tmp/batch_new.json > /tmp/batch_new.log 2>&1
  echo "== batch rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_new.log | tail -8
fi
(cd /tmp && tar czf $OUT/rest.tgz floor_* batch_* layer_gemms.* 2>/dev/null)
date -u; echo "took $(( $(date +%s) - S )) s"
