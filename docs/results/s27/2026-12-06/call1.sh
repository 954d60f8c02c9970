#!/bin/bash
# Session 27, call 1 (issue 16): 1. the host gates' CUDA test and the queued sampler's (a split
# step's sampler queued with its forward behind a spinning gate kernel its fill opens,
# ASERVE_QUEUED_SAMPLER=1; =2: the fill on the helper thread while the loop plans and launches);
# 2. the structured bench taking turns: Q0 (today's), Q1, Q2, with the mask fill's pool at 8
# (the default) and 16 threads (ASERVE_MASK_FILL=executor:N; the commit's grammar advance uses
# the same pool); 3. timeline.py (session 26's) at 256 rows, Q2.
# Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-520}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; P=docs/results/s26/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 60 python -m pytest -q -m "" tests/gpu/test_host_gates.py > $OUT/gpu_gates.txt 2>&1
rc=$?; echo "gate test rc=$rc"; grep -E "passed|failed|Error" $OUT/gpu_gates.txt | tail -5
Q1=1; [ $rc -eq 0 ] || { Q1=""; echo "queued runs skipped: the gate test failed"; }
timeout 150 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py -k "queued" > $OUT/gpu_tests.txt 2>&1
echo "queued tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 queued, $3 threads
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  [ "$2" = 0 ] || [ -n "$Q1" ] || return
  ASERVE_QUEUED_SAMPLER=$2 ASERVE_MASK_FILL=executor:$3 timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured Q0T8a 0 8
structured Q2T8a 2 8
structured Q1T8a 1 8
structured Q2T16a 2 16
structured Q0T16a 0 16
structured Q0T8b 0 8
structured Q2T8b 2 8
structured Q1T8b 1 8
if [ -n "$Q1" ] && [ $(left) -gt 40 ]; then
  ASERVE_QUEUED_SAMPLER=2 timeout 40 python $P/timeline.py --tokenizer-dir .gpu --batch 256 --out $OUT/timeline256_q2.json 2>&1 | grep -v "^20..-" | tail -16
fi
date -u; echo "took $(( $(date +%s) - S )) s"
