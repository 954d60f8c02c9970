#!/bin/bash
# Session 20, call 3 (issue 16): HEAD 9fa1211 (masked argmax as a min over the loaded block, the
# masks filled beside the commit before) against d8351c0 (.gpu/before), and HEAD without the
# fused masked argmax (.gpu/beside). 1. The kernel and structured GPU tests. 2. The kernel
# alone. 3. The constrained decode at 64/256, taking turns, at the default fill and executor:8.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1; R=docs/results/s20/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
for t in before beside; do (cd .gpu/$t && python setup.py build_ext --inplace > /tmp/b_$t.txt 2>&1 || cp /tmp/b_$t.txt $OUT/) & done; wait
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -m "" tests/kernels/test_bitmask.py tests/gpu/test_structured_cuda.py > $OUT/gpu_tests.txt 2>&1; RC=$?; echo "gpu tests rc=$RC"; tail -1 $OUT/gpu_tests.txt; grep ^FAILED $OUT/gpu_tests.txt | head
PYTHONPATH=$ROOT timeout 60 python $R/kernel_ab.py $OUT/kernel_ab.json 2>&1 | tail -9
structured() {  # $1 label, $2 tree, then env
  local t=$1 D=$2; shift 2
  LEFT=$(( 560 - ($(date +%s) - S) )); [ $LEFT -gt 45 ] || return
  (cd $D && env PYTHONPATH=$D "$@" timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1; echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log)
}
HEAD_TREE=$ROOT; [ $RC = 0 ] || HEAD_TREE=$ROOT/.gpu/beside  # a failing kernel: measure the rest
structured head $HEAD_TREE ASERVE_X=1
structured before $ROOT/.gpu/before ASERVE_X=1
structured head_fill8 $HEAD_TREE ASERVE_MASK_FILL=executor:8
structured before_fill8 $ROOT/.gpu/before ASERVE_MASK_FILL=executor:8
structured beside_fill8 $ROOT/.gpu/beside ASERVE_MASK_FILL=executor:8
date -u; echo "took $(( $(date +%s) - S )) s"
