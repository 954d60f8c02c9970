#!/bin/bash
# Session 21, call 1 (issue 16): where a constrained step's host time goes at the current code
# (host_parts.py at 64 and 256, the default fill and 8 threads), then the constrained decode
# against the free one at the default fill and at executor:8, three pairs each, taking turns.
# Carry [".gpu", ".whl"] (../shared/device.md).
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s21/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
for F in default executor:8; do
  T=${F#executor:}
  env $([ $F = default ] && echo ASERVE_X=1 || echo ASERVE_MASK_FILL=$F) timeout 150 python $R/host_parts.py --tokenizer-dir .gpu --out $OUT/host_parts_$T.json > /tmp/hp_$T.log 2>&1
  echo "host_parts $F rc=$?"; grep -v "request_end\|phase_done\|engine_started\|grammar_tok\|Writing" /tmp/hp_$T.log | tail -60
done
structured() {  # $1 label, then env
  local t=$1; shift
  LEFT=$(( 585 - ($(date +%s) - S) )); [ $LEFT -gt 60 ] || return
  env "$@" timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured --batches 64,256 \
    --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured default ASERVE_X=1
structured fill8 ASERVE_MASK_FILL=executor:8
date -u; echo "took $(( $(date +%s) - S )) s"
