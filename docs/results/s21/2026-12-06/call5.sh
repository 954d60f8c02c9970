#!/bin/bash
# Session 21, call 5 (issue 16), at 2de05fc: the constrained decode against the free one, HEAD
# against HEAD with session 20's fill beside the commit re-applied (.gpu/beside: `git revert
# --no-commit 02e14f1` on 2de05fc, in a worktree), three pairs each, taking turns, at the
# default fill; then host_parts.py at HEAD (where the step's host time goes now).
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1; ROOT=$PWD; R=docs/results/s21/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/beside && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
structured() {  # $1 label, $2 tree
  local t=$1 D=$2
  LEFT=$(( 300 - ($(date +%s) - S) )); [ $LEFT -gt 60 ] || return
  (cd $D && PYTHONPATH=$D timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured \
    --batches 64,256 --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
   echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log)
}
structured head $ROOT
structured beside $ROOT/.gpu/beside
LEFT=$(( 320 - ($(date +%s) - S) )); [ $LEFT -gt 40 ] && PYTHONPATH=$ROOT timeout $LEFT python $R/host_parts.py --tokenizer-dir .gpu --batches 256 --out $OUT/host_parts.json 2>&1 | grep -v "request_end\|phase_done\|engine_started\|grammar_tok\|Writing" | tail -30
date -u; echo "took $(( $(date +%s) - S )) s"
