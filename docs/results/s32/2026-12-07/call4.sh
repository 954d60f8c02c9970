#!/bin/bash
# Ran at b820fc3 as BUDGET=290 PDL_TESTS=0 RUNS="base1 pdl1 heads1 both1 base2 pdl2 heads2";
# the heads-first grid it measures was removed after it (not kept).
# Session 32, call 4 (issue 15): two changes to the decode step's kernels, each off by default
# until measured here:
# - PDL (ASERVE_PDL=1, aserve/kernels/pdl.py): the step's Triton kernels launched with
#   programmatic dependent launch, each waiting (gdc_wait) for the kernel ahead of it first;
# - the decode attention's grid with a token's KV heads first (ASERVE_DECODE_GRID=heads), so
#   the programs reading one token's heads, which lie together in the cache, run together
#   (Llama 3.2 1B's shape has 8 KV heads; Gemma 3 270M's one: no change expected there).
# Tests first (attention, kernels, and tokens with PDL against without on CUDA), then the decode
# step against its floor taking turns, then Llama's decode runs at 64 / 256 / 512.
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-400}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; python -c "import torch, triton; print(torch.__version__, triton.__version__)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/gpu/test_pdl_cuda.py tests/attention tests/kernels/test_bitmask.py > $OUT/tests.txt 2>&1
echo "tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2; grep -E "^(FAILED|ERROR)|Error:" $OUT/tests.txt | head -6
[ "${PDL_TESTS:-1}" = 1 ] && ASERVE_PDL=1 timeout 100 python -m pytest -q -m "" tests/attention tests/kernels/test_bitmask.py > $OUT/tests_pdl.txt 2>&1
echo "tests under ASERVE_PDL=1 rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/tests_pdl.txt | tail -2; grep -E "^(FAILED|ERROR)|Error:" $OUT/tests_pdl.txt | head -6
floor() {  # $1 label, then VAR=value settings
  local t=$1 L=$(left); shift
  [ $L -gt 40 ] || { echo "floor $t skipped: $L s left"; return; }
  env "$@" timeout $L python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$t.json > /tmp/floor_$t.log 2>&1
  echo "== $t ($*) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$t.log; grep -E "Error" /tmp/floor_$t.log | tail -3
}
for run in ${RUNS:-base1 pdl1 heads1 both1 base2 pdl2 heads2 both2}; do
  case ${run%[0-9]} in
    base) floor $run ASERVE_PDL=0 ASERVE_DECODE_GRID=rows ;;
    pdl) floor $run ASERVE_PDL=1 ASERVE_DECODE_GRID=rows ;;
    heads) floor $run ASERVE_PDL=0 ASERVE_DECODE_GRID=heads ;;
    both) floor $run ASERVE_PDL=1 ASERVE_DECODE_GRID=heads ;;
  esac
done
date -u; echo "took $(( $(date +%s) - S )) s"
