#!/bin/bash
# Session 21, call 2 (issue 16): the one-launch masked argmax (with the FutureMap publish in it)
# against session 20's pair and the in-place masks. 1. The kernel and structured GPU tests.
# 2. kernel_ab.py (device time from graph replays, and eager calls back to back). 3. The
# constrained decode against the free one, now and before (.gpu/before: the tree at 29e89c8,
# `git worktree add .gpu/before 29e89c8`), at the default fill and at executor:8, three pairs
# each, taking turns; then now with the fused kernel off (FUSED_ARGMAX_ROWS=10**9: the in-place
# masks at every size). Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1; ROOT=$PWD; R=docs/results/s21/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/before && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -m "" tests/kernels/test_bitmask.py tests/gpu/test_structured_cuda.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3
PYTHONPATH=$ROOT timeout 90 python $R/kernel_ab.py $OUT/kernel_ab.json 2>&1 | tail -9
structured() {  # $1 label, $2 tree, $3 FUSED_ARGMAX_ROWS (or "-"), then env
  local t=$1 D=$2 rows=$3; shift 3
  LEFT=$(( 585 - ($(date +%s) - S) )); [ $LEFT -gt 60 ] || return
  local set=""; [ "$rows" = "-" ] || set="import aserve.device.runner as r; r.FUSED_ARGMAX_ROWS = $rows"
  (cd $D && env PYTHONPATH=$D "$@" timeout $LEFT python -c "
import sys
$set
from aserve.bench.device_bench import main
sys.argv = ['device_bench', '--tokenizer-dir', '$ROOT/.gpu', '--only', 'structured', '--batches', '64,256',
            '--structured-repeats', '3', '--out', '$OUT/structured_$t.json']
main()" > /tmp/structured_$t.log 2>&1; echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log)
}
structured now $ROOT - ASERVE_X=1
structured before $ROOT/.gpu/before - ASERVE_X=1
structured now_fill8 $ROOT - ASERVE_MASK_FILL=executor:8
structured before_fill8 $ROOT/.gpu/before - ASERVE_MASK_FILL=executor:8
structured now_inplace $ROOT 1000000000 ASERVE_X=1
date -u; echo "took $(( $(date +%s) - S )) s"
