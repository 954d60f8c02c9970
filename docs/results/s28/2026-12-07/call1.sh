#!/bin/bash
# Session 28, call 1 (was session 27's call 3, never run) (issue 16). Call 2 found the queued sampler with its fill on the helper
# (Q2) no faster than today's launch (Q0): with the loop's work off the chain, what is left on it
# is the grammar work and then the masks' whole copy (~0.4 ms at 256 rows). Here a masked-argmax
# step's masks are filled and sent in chunks (ASERVE_FILL_CHUNKS=N), each chunk's copy behind its
# own gate while the next chunk fills. 1. the queued sampler's CUDA tests (chunks included);
# 2. the structured bench taking turns: Q0, Q2 with 4 chunks (2 if time is left). Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-430}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 60 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py -k "queued" > $OUT/gpu_tests.txt 2>&1
rc=$?; echo "queued tests rc=$rc"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 queued, $3 chunks
  local t=$1 L=$(left)
  [ $L -gt 45 ] || { echo "structured $t skipped: $L s left"; return; }
  ASERVE_QUEUED_SAMPLER=$2 ASERVE_FILL_CHUNKS=$3 timeout $L python -m aserve.bench.device_bench --tokenizer-dir .gpu \
    --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
  grep -E "Error" /tmp/structured_$t.log | tail -2
}
structured Q0a 0 1
structured Q2C4a 2 4
structured Q0b 0 1
structured Q2C4b 2 4
structured Q2C2a 2 2
date -u; echo "took $(( $(date +%s) - S )) s"
