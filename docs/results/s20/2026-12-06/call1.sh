#!/bin/bash
# Session 20, call 1 (prepared in session 19; no device time was left to it) for
# issue 16 after 470a4d6 (constrained requests in the persistent decode batch). Ask for
# nvidia-h200; carry [".gpu", ".whl"]; build .whl and .gpu/tokenizer.model as ../shared/device.md
# says; `git worktree add .gpu/base 2be72cd` (the build before 470a4d6) and copy it in.
# 1. The structured GPU tests at HEAD. 2. The host chain on that host's CPU (host_step
# --constrained, the fill's thread counts). 3. The constrained decode: HEAD, HEAD with the
# sampler after the whole commit (ASERVE_EARLY_SAMPLER=0), base, then HEAD at executor:8.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/base && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
date -u
PYTHONPATH=$ROOT timeout 120 python -m pytest -q -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
for F in executor:4 executor:8; do
  PYTHONPATH=$ROOT timeout 60 python -m aserve.bench.host_step --constrained --tokenizer-dir .gpu --fill $F --batches 256,512 --steps 60 --out $OUT/host_step_${F#executor:}.json 2>&1 | tail -4
done
structured() {  # $1 label, $2 tree, then env
  local t=$1 D=$2; shift 2
  LEFT=$(( 580 - ($(date +%s) - S) )); [ $LEFT -gt 40 ] || return
  (cd $D && env PYTHONPATH=$D "$@" timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --structured-repeats 1 --out $OUT/structured_$t.json > $OUT/structured_$t.log 2>&1; echo "structured $t rc=$?"; grep "^structured b=" $OUT/structured_$t.log)
}
structured head $ROOT ASERVE_X=1
structured head_late $ROOT ASERVE_EARLY_SAMPLER=0
structured base $ROOT/.gpu/base ASERVE_X=1
structured head_fill8 $ROOT ASERVE_MASK_FILL=executor:8
date -u; echo "took $(( $(date +%s) - S )) s"
