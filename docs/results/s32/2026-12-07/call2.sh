#!/bin/bash
# Session 32, call 2 (issue 15): the decode graph's greedy argmax as the split-row kernel
# (bitmask.argmax_, the default here) against torch's (ASERVE_GRAPH_ARGMAX=torch), and the
# decode attention's split count (ASERVE_DECODE_LAUNCH's fourth value; 0 = the kernel's own:
# 2 on Gemma's one KV head at 256 rows, 1 on Llama's eight). GPU tests first. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 240 python -m pytest -q -m "" tests/kernels/test_bitmask.py tests/gpu/test_cuda_engine.py tests/attention tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1
echo "GPU tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head -8
floor() {  # $1 label, then VAR=value settings
  local t=$1 L=$(left); shift
  [ $L -gt 45 ] || { echo "floor $t skipped: $L s left"; return; }
  env "$@" timeout $L python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$t.json > /tmp/floor_$t.log 2>&1
  echo "== $t ($*) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$t.log; grep -E "Error" /tmp/floor_$t.log | tail -3
}
floor split1 ASERVE_GRAPH_ARGMAX=split
floor torch1 ASERVE_GRAPH_ARGMAX=torch
floor s1 ASERVE_DECODE_LAUNCH=32,4,3,1
floor s4 ASERVE_DECODE_LAUNCH=32,4,3,4
floor split2 ASERVE_GRAPH_ARGMAX=split
floor torch2 ASERVE_GRAPH_ARGMAX=torch
floor s1b ASERVE_DECODE_LAUNCH=32,4,3,1
L=$(left); [ $L -gt 60 ] && { timeout $L python -m aserve.bench.decode_kernels --only step --out $OUT/step_profile.json > /tmp/step.log 2>&1; echo "step profile rc=$?"; tail -40 /tmp/step.log; }
date -u; echo "took $(( $(date +%s) - S )) s"
