#!/bin/bash
# Session 31, call 1 (issue 16). A greedy whole step's automaton rows are now drawn in one launch
# a automaton (automaton_argmax_: state, mask, masked argmax, next state; 0c6a001) where session
# 30's device path took nine (gathers, masked argmax, lookup). First the structured CUDA tests and
# the bitmask kernels' (the automata's tokens against llguidance alone in serial mode; one launch
# against the three apart), then the structured bench taking turns: D (the defaults: one launch),
# A (ASERVE_FSM_ONE_LAUNCH=0: session 30's defaults). Three pairs a cell (REPEATS): the bench's
# median pair is the middle one. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 200 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py -k "${TESTS_K:-}" > $OUT/gpu_tests.txt 2>&1
echo "structured CUDA + bitmask tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head -5
structured() {  # $1 label, then VAR=value settings
  local t=$1 L=$(left); shift
  [ $L -gt 60 ] || { echo "structured $t skipped: $L s left"; return; }
  env "$@" timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats ${REPEATS:-3} --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log) fsm=$(grep -c grammar_fsm_built /tmp/structured_$t.log) after $(( $(date +%s) - S )) s"
  grep "^structured b=" /tmp/structured_$t.log; grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured D1 ASERVE_FSM_ONE_LAUNCH=1
structured A1 ASERVE_FSM_ONE_LAUNCH=0
structured D2 ASERVE_FSM_ONE_LAUNCH=1
structured A2 ASERVE_FSM_ONE_LAUNCH=0
structured D3 ASERVE_FSM_ONE_LAUNCH=1
date -u; echo "took $(( $(date +%s) - S )) s"
