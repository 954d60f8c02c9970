#!/bin/bash
# Session 22, call 1 (issue 16): the grammar work beside the commit (a GrammarJob on a helper
# thread: the commit's advance, then the split step's masks, on llguidance's pool, while the
# loop's thread commits). 1. The CUDA structured tests and the kernel's. 2. The constrained
# decode against the free one, the new order (default) and the two-part commit before it
# (ASERVE_GRAMMAR_BESIDE=0), taking turns, three pairs a run. 3. host_parts.py if time is left.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s22/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 150 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py -x > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.txt
structured() {  # $1 label, $2 ASERVE_GRAMMAR_BESIDE
  local t=$1 b=$2
  LEFT=$(( 575 - ($(date +%s) - S) )); [ $LEFT -gt 80 ] || return
  ASERVE_GRAMMAR_BESIDE=$b timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured \
    --batches 64,256 --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured beside1 1
structured twopart1 0
structured beside2 1
structured twopart2 0
LEFT=$(( 580 - ($(date +%s) - S) )); [ $LEFT -gt 50 ] && timeout $LEFT python $R/host_parts.py --tokenizer-dir .gpu --batches 256 --out $OUT/host_parts.json 2>&1 | grep -v "request_end\|phase_done\|engine_started\|grammar_tok\|Writing" | tail -30
date -u; echo "took $(( $(date +%s) - S )) s"
