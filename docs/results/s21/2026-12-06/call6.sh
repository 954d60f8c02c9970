#!/bin/bash
# Session 21, call 6 (issue 16, for choosing): xgrammar's mask fill against llguidance's on the
# H100 host's CPU, 256 and 64 rows of the bench schema's walks (docs/results/s21/xgrammar/).
# Carry [".gpu", ".whl"] (.whl/xg: xgrammar 0.2.9 and apache-tvm-ffi for cp312).
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl .whl/xg/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
for T in 8 16; do
  timeout 60 python docs/results/s21/xgrammar/xgrammar_vs_llguidance.py --tokenizer-dir .gpu --rows 256 --threads $T --out $OUT/xgrammar_256_t$T.json 2>&1 | grep -v grammar_tok | tail -6
done
timeout 40 python docs/results/s21/xgrammar/xgrammar_vs_llguidance.py --tokenizer-dir .gpu --rows 64 --threads 8 --out $OUT/xgrammar_64_t8.json 2>&1 | grep -v grammar_tok | tail -6
