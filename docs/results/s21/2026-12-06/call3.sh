#!/bin/bash
# Session 21, call 3 (issue 16) at the new defaults (the one-launch masked argmax, the fill on
# half the cores). 1. templates.py: does the fill scale with threads when each row has its own
# lexer (256 and 64 rows)? 2. The GPU suite. 3. The constrained decode against the free one at
# the default fill (now executor:8 on 16 cores) and at executor:4, three pairs each.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s21/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 120 python $R/templates.py --tokenizer-dir .gpu --rows 256 --threads 4,8,16 --out $OUT/templates_256.json 2>&1 | tail -8
timeout 60 python $R/templates.py --tokenizer-dir .gpu --rows 64 --threads 8 --out $OUT/templates_64.json 2>&1 | tail -4
timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_suite.txt 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|error" $OUT/gpu_suite.txt | tail -3
structured() {  # $1 label, then env
  local t=$1; shift
  LEFT=$(( 585 - ($(date +%s) - S) )); [ $LEFT -gt 60 ] || return
  env "$@" timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured --batches 64,256 \
    --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured default ASERVE_X=1
structured fill4 ASERVE_MASK_FILL=executor:4
date -u; echo "took $(( $(date +%s) - S )) s"
