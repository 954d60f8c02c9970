#!/bin/bash
# Session 29, call 2 (issue 16): token automata whose masks are llguidance's, on by default on a
# GPU. First the structured CUDA tests (the gather's tokens against llguidance alone in serial
# mode among them), then the structured bench taking turns: D (the defaults: automata) and L
# (ASERVE_GRAMMAR_FSM=0: llguidance alone, the code before this session's default).
# Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-480}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; git log --oneline -1 2>/dev/null
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py -k "${TESTS_K:-}" > $OUT/gpu_tests.txt 2>&1
echo "structured CUDA tests rc=$?"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head -5
structured() {  # $1 label, $2 ASERVE_GRAMMAR_FSM ("" for the default)
  local t=$1 L=$(left)
  [ $L -gt 60 ] || { echo "structured $t skipped: $L s left"; return; }
  if [ -n "$2" ]; then export ASERVE_GRAMMAR_FSM=$2; else unset ASERVE_GRAMMAR_FSM; fi
  timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log) fsm=$(grep -c grammar_fsm_built /tmp/structured_$t.log) unequal=$(grep -c grammar_fsm_unequal /tmp/structured_$t.log)"
  grep "grammar_fsm_built" /tmp/structured_$t.log | head -1
  grep "^structured b=" /tmp/structured_$t.log; grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured D1 ""
structured L1 0
structured D2 ""
structured L2 0
date -u; echo "took $(( $(date +%s) - S )) s"
