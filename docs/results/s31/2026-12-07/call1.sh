#!/bin/bash
# Session 31, call 1 (issue 16; session 30 call 4 again at 032b72a, with the mixed automaton+regex CUDA test): token automata on the device (aserve/device/automata.py): a
# step whose constrained rows are all in automata is launched whole, never split. First the
# structured CUDA tests (the automata's tokens against llguidance alone in serial mode), then
# the structured bench taking turns: D (the defaults: automata on the device), S
# (ASERVE_FSM_ON_DEVICE=0: split steps gathering the automaton's masks, session 29's default);
# D and S in turn. Call 3 put the device path's launch at 256 rows at ~1.0 ms, most of it
# plan_automata's pass over the rows: a decode block's steady steps now skip it (4ea2f2a).
# Three repeats a cell (REPEATS): the bench's median pair is then the middle one, not the higher of two.
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-540}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 170 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py -k "${TESTS_K:-}" > $OUT/gpu_tests.txt 2>&1
echo "structured CUDA tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head -5
structured() {  # $1 label, then VAR=value settings
  local t=$1 L=$(left); shift
  [ $L -gt 60 ] || { echo "structured $t skipped: $L s left"; return; }
  env "$@" timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats ${REPEATS:-3} --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log) fsm=$(grep -c grammar_fsm_built /tmp/structured_$t.log) after $(( $(date +%s) - S )) s"
  grep "^structured b=" /tmp/structured_$t.log; grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured D1 ASERVE_FSM_ON_DEVICE=1
structured S1 ASERVE_FSM_ON_DEVICE=0
structured D2 ASERVE_FSM_ON_DEVICE=1
structured S2 ASERVE_FSM_ON_DEVICE=0
structured D3 ASERVE_FSM_ON_DEVICE=1
date -u; echo "took $(( $(date +%s) - S )) s"
