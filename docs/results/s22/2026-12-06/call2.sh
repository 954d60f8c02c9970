#!/bin/bash
# Session 22, call 2 (issue 16), at 06dddfb: 1. advance_par.py (256 rows: the grammar advance
# serial against llguidance's pool at 4, 8, 16 threads, beside the fill). 2. The constrained
# decode against the free one: the grammar work beside the commit (default) and the two-part
# commit (ASERVE_GRAMMAR_BESIDE=0) taking turns, then beside at executor:16.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s22/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 120 python $R/advance_par.py --tokenizer-dir .gpu --threads 4,8,16 --out $OUT/advance_par.json 2>&1 | grep -v "^20..-" | tail -9
structured() {  # $1 label, $2 ASERVE_GRAMMAR_BESIDE, $3 ASERVE_MASK_FILL
  local t=$1 b=$2 f=$3
  LEFT=$(( 570 - ($(date +%s) - S) )); [ $LEFT -gt 80 ] || return
  ASERVE_GRAMMAR_BESIDE=$b ASERVE_MASK_FILL=$f timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured \
    --batches 64,256 --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured twopart1 0 ""
structured beside1 1 ""
structured twopart2 0 ""
structured beside2 1 ""
structured beside16 1 executor:16
structured twopart16 0 executor:16
date -u; echo "took $(( $(date +%s) - S )) s"
