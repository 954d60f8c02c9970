#!/bin/bash
# Session 22, call 4 (issue 16), at 06dddfb: 1. the GPU suite. 2. The constrained decode against
# the free one, the grammar work beside the commit (default) and the two-part commit
# (ASERVE_GRAMMAR_BESIDE=0) taking turns, two runs each. 3. timeline.py at 256, one each.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s22/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_suite.txt 2>&1
echo "gpu suite rc=$?"; tail -3 $OUT/gpu_suite.txt
structured() {  # $1 label, $2 ASERVE_GRAMMAR_BESIDE
  local t=$1 b=$2
  LEFT=$(( 500 - ($(date +%s) - S) )); [ $LEFT -gt 80 ] || return
  ASERVE_GRAMMAR_BESIDE=$b timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured \
    --batches 64,256 --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured beside1 1
structured twopart1 0
structured beside2 1
structured twopart2 0
tl() {  # $1 label, $2 ASERVE_GRAMMAR_BESIDE
  LEFT=$(( 585 - ($(date +%s) - S) )); [ $LEFT -gt 35 ] || return
  echo "== $1"; ASERVE_GRAMMAR_BESIDE=$2 timeout $LEFT python $R/timeline.py --batch 256 --out $OUT/timeline_$1.json 2>&1 | grep -v "^20..-\|Writing" | tail -14
}
tl beside256 1
tl twopart256 0
date -u; echo "took $(( $(date +%s) - S )) s"
