#!/bin/bash
# Session 20, call 4: the GPU suite at HEAD, then the constrained decode at 64/256, HEAD
# (fused masked argmax from 128 rows) against d8351c0 (.gpu/before), default fill, taking turns.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/before && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep ^FAILED $OUT/gpu_tests.txt | head
structured() {  # $1 label, $2 tree
  local t=$1 D=$2
  LEFT=$(( 290 - ($(date +%s) - S) )); [ $LEFT -gt 45 ] || return
  (cd $D && PYTHONPATH=$D timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1; echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log)
}
structured head $ROOT
structured before $ROOT/.gpu/before
date -u; echo "took $(( $(date +%s) - S )) s"
