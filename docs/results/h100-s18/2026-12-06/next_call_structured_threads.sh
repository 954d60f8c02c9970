#!/bin/bash
# Prepared in session 18, not run (calls 4-7 were refused: no machine could be started; the budget ran out).
# Session 18, call 7: issue 16's constrained decode against the fill's thread count (the default,
# a quarter of the cores: 4 on 16), batches 64 and 256, two repeats each; as many as fit.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
for F in executor:4 executor:12 executor:8; do
  N=${F#executor:}; LEFT=$(( 200 - ($(date +%s) - S) ))
  [ $LEFT -gt 30 ] || break
  ASERVE_MASK_FILL=$F timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$N.json > $OUT/structured_$N.log 2>&1; echo "$F rc=$? at $(( $(date +%s) - S )) s"; grep "^structured b=" $OUT/structured_$N.log
done
date -u; echo "took $(( $(date +%s) - S )) s"
