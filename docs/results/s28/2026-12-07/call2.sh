#!/bin/bash
# Session 28, call 2 (issue 16): constrained decode with llguidance (today's default) against
# the token automaton (ASERVE_GRAMMAR_FSM=1: the bench's schema is in its subset, so its rows'
# masks are gathered on the device from the automaton's table and its advance is one lookup),
# taking turns; first the structured CUDA tests (the gather's against serial mode among them).
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-400}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 100 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py -k "${TESTS_K:-automaton or masked_argmax}" > $OUT/gpu_tests.txt 2>&1
echo "structured CUDA tests rc=$?"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head -5
[ $(left) -gt 280 ] && timeout 50 python docs/results/s28/2026-12-07/fsm_chain.py --tokenizer-dir .gpu --fill executor:8 --rows 256 --out $OUT/fsm_chain.json 2>&1 | grep -v "\[info"
structured() {  # $1 label, $2 ASERVE_GRAMMAR_FSM
  local t=$1 L=$(left)
  [ $L -gt 60 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_GRAMMAR_FSM=$2 timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log) fsm=$(grep -c grammar_fsm_built /tmp/structured_$t.log)"
  grep "^structured b=" /tmp/structured_$t.log; grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured A1 1
structured L1 0
structured A2 1
structured L2 0
date -u; echo "took $(( $(date +%s) - S )) s"
