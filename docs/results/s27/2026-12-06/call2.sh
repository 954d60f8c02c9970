#!/bin/bash
# Session 27, call 2 (issue 16), after call 1 found the queued masked-argmax step's outputs read
# from the eager sampler's (empty) buffers: 1. the queued sampler's CUDA tests; 2. the structured
# bench taking turns, 8 fill threads (call 1: 16 slower): Q0 (today's), Q2 (queued, the fill on
# the helper thread), Q1 (queued, the fill on the loop); 3. timeline.py (session 26's) at 256
# rows, Q2. Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-480}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; P=docs/results/s26/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 120 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/gpu/test_host_gates.py -k "queued or gate" > $OUT/gpu_tests.txt 2>&1
rc=$?; echo "queued tests rc=$rc"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 queued
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_QUEUED_SAMPLER=$2 timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
  grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured Q0a 0
structured Q2a 2
structured Q1a 1
structured Q2b 2
structured Q0b 0
if [ $(left) -gt 40 ]; then
  ASERVE_QUEUED_SAMPLER=2 timeout 40 python $P/timeline.py --tokenizer-dir .gpu --batch 256 --out $OUT/timeline256_q2.json 2>&1 | grep -v "^20..-" | tail -16
fi
structured Q1b 1
date -u; echo "took $(( $(date +%s) - S )) s"
