#!/bin/bash
# Prepared in session 35, NOT RUN (the device time went to call 3, its cut-down form). Issue 15: split-K output and down projections (kernels/linear.py, layers.project;
# their partials summed by the fused add + norm). The GPU tests of the new path; the two
# projections alone at many batch sizes (for the rule's edges); floors with split-K against
# ASERVE_SPLIT_K=0 (cuBLAS), taking turns; decode runs at 64 / 256 rows, both settings.
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/gpu/test_split_k_cuda.py tests/kernels/test_linear.py \
  tests/kernels/test_fused.py tests/gpu/test_pdl_cuda.py tests/gpu/test_cuda_engine.py > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -8
t=90
for run in split1 cublas1 split2; do
  [ $(left) -gt 150 ] || { echo "floor $run skipped"; continue; }
  case $run in cublas*) env="ASERVE_SPLIT_K=0";; *) env="ASERVE_SPLIT_K=1";; esac
  env $env timeout $t python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out /tmp/floor_$run.json > /tmp/floor_$run.log 2>&1
  echo "== $run ($env) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step|copy" /tmp/floor_$run.log | tail -3; t=45
done
for run in split cublas; do
  L=$(left); [ $L -gt 50 ] || { echo "batch $run skipped"; continue; }
  env="ASERVE_SPLIT_K=1"; [ $run = cublas ] && env="ASERVE_SPLIT_K=0"
  env $env timeout $(( L < 65 ? L - 5 : 60 )) python -m aserve.bench.device_bench --only batch --batches 64,256 \
    --batch-shapes gemma,llama --out /tmp/batch_$run.json > /tmp/batch_$run.log 2>&1
  echo "== batch $run rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|^ +batch " /tmp/batch_$run.log | tail -5
done
[ $(left) -gt 60 ] && timeout $(( $(left) - 10 )) python -m aserve.bench.layer_gemms --gemms o,down --batches 1,8,16,32,48,64,96,128,192,256 \
  --tiles 64x32x128,64x64x128,32x32x128 --splits 1,2,4,8 --out /tmp/layer_gemms.json > /tmp/layer_gemms.log 2>&1
echo "gemms rc=$? after $(( $(date +%s) - S )) s"; tail -42 /tmp/layer_gemms.log
(cd /tmp && tar czf $OUT/rest.tgz floor_* batch_* layer_gemms.* 2>/dev/null)
date -u; echo "took $(( $(date +%s) - S )) s"
