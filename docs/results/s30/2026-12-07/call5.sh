#!/bin/bash
# Session 30, call 5 (issue 16): the defaults (D: automata on the device) and S
# (ASERVE_FSM_ON_DEVICE=0) once each at 64 and 256 rows, at 4ea2f2a, on whatever card the
# last of the session's device time gets. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-200}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
structured() {  # $1 label, then VAR=value settings
  local t=$1 L=$(left); shift
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  env "$@" timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log) after $(( $(date +%s) - S )) s"
  grep "^structured b=" /tmp/structured_$t.log; grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured D1 ASERVE_FSM_ON_DEVICE=1
structured S1 ASERVE_FSM_ON_DEVICE=0
structured D2 ASERVE_FSM_ON_DEVICE=1
date -u; echo "took $(( $(date +%s) - S )) s"
