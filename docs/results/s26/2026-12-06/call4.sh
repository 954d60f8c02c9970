#!/bin/bash
# Session 26, call 4 (issue 16), prepared and not run (no device time left to start one): for
# the next session's first call. 1. wait_value_probe.py (can a stream wait for a host-written
# flag; how soon after the store does queued work finish); 2. the structured CUDA tests (the
# queued sampler's GPU test among them); 3. the structured bench taking turns: A the tree;
# Q ASERVE_QUEUED_SAMPLER=1 (a split step's sampler queued with its forward behind a gate its
# fill opens); S serial_advance.py (the commit's grammar advance one row after another, not on
# the pool). Carry [".gpu", ".whl"]; BUDGET seconds.
S=$(date +%s); BUDGET=${BUDGET:-430}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; D=docs/results/s26/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 30 python $D/wait_value_probe.py --out $OUT/wait_value.json 2>&1 | tail -3
timeout 150 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 runner prefix, $3 ASERVE_QUEUED_SAMPLER
  local t=$1 L=$(left)
  [ $L -gt 50 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_QUEUED_SAMPLER=$3 timeout $L python $2 aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured A1 "-m" 0
structured Q1 "-m" 1
structured S1 "$D/serial_advance.py" 0
structured A2 "-m" 0
structured Q2 "-m" 1
structured S2 "$D/serial_advance.py" 0
date -u; echo "took $(( $(date +%s) - S )) s"
