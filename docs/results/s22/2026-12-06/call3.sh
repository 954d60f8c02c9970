#!/bin/bash
# Session 22, call 3 (issue 16), at 06dddfb + timeline.py: the host's timeline of a constrained
# decode step, the grammar work beside the commit (default) against the two-part commit
# (ASERVE_GRAMMAR_BESIDE=0), batch 256 and 64, taking turns. Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s22/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
tl() {  # $1 label, $2 ASERVE_GRAMMAR_BESIDE, $3 batch
  LEFT=$(( 400 - ($(date +%s) - S) )); [ $LEFT -gt 40 ] || return
  echo "== $1"; ASERVE_GRAMMAR_BESIDE=$2 timeout $LEFT python $R/timeline.py --batch $3 --out $OUT/timeline_$1.json 2>&1 | grep -v "^20..-" | tail -16
}
tl beside256 1 256
tl twopart256 0 256
tl beside64 1 64
tl twopart64 0 64
tl beside256b 1 256
date -u; echo "took $(( $(date +%s) - S )) s"
