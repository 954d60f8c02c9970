#!/bin/bash
# Session 21, call 4 (issue 16): templates per fill thread. 1. templates.py at 256 rows (8 and 16
# threads; 1, 4 and 16 templates a thread; a matcher per row) and 64 rows. 2. The constrained
# decode against the free one with TEMPLATES_PER_THREAD 4 (the new default), 1 (before) and 16,
# three pairs each, at the default fill (executor:8 on 16 cores). Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s21/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 120 python $R/templates.py --tokenizer-dir .gpu --rows 256 --threads 8,16 --per-thread 1,4,16 --out $OUT/templates_256.json 2>&1 | tail -10
timeout 60 python $R/templates.py --tokenizer-dir .gpu --rows 64 --threads 8 --per-thread 1,4,16 --out $OUT/templates_64.json 2>&1 | tail -6
structured() {  # $1 label, $2 templates per thread
  local t=$1 k=$2
  LEFT=$(( 440 - ($(date +%s) - S) )); [ $LEFT -gt 60 ] || return
  timeout $LEFT python -c "
import sys
import aserve.sampling.grammar as g; g.TEMPLATES_PER_THREAD = $k
from aserve.bench.device_bench import main
sys.argv = ['device_bench', '--tokenizer-dir', '.gpu', '--only', 'structured', '--batches', '64,256',
            '--structured-repeats', '3', '--out', '$OUT/structured_$t.json']
main()" > /tmp/structured_$t.log 2>&1; echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured k4 4
structured k1 1
structured k16 16
date -u; echo "took $(( $(date +%s) - S )) s"
