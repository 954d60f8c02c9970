#!/bin/bash
# Session 15, call 5: issue 14's served workload, 4 front ends, the build before the columnar
# Outputs (017450b, in .gpu/base) and HEAD (d199d5b) one after the other on one machine, each
# against its own engine runs; then HEAD again while time lasts.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/base && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
ARGS="--tokenizer-dir $ROOT/.gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --rates ''"
run() {  # $1 label, $2 tree, $3 repeats
  LEFT=$(( 440 - ($(date +%s) - S) )); [ $LEFT -lt 70 ] && { echo "skip $1"; return; }
  (cd $2 && PYTHONPATH=$2 timeout $LEFT python -m aserve.bench.served --tokenizer-dir $ROOT/.gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --rates "" --repeats $3 --out $OUT/served_$1.json > /tmp/served_$1.log 2>&1); echo "$1 rc=$? $(date -u +%T)"; grep -A7 "^run  " /tmp/served_$1.log | cut -c1-215
}
date -u
run base1 $ROOT/.gpu/base 3
run head1 $ROOT 3
run head2 $ROOT 2
date -u
