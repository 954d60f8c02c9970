#!/bin/bash
# Prepared in session 20 for the next device call on issue 16 (ask for nvidia-h200: the issue's
# figure is an H200's; carry [".gpu", ".whl"]; build .whl and .gpu/tokenizer.model as
# ../shared/device.md says). The hosts' CPUs differ by ~2x between calls: everything compared
# is in this one call, taking turns. 1. The structured GPU tests. 2. The host's chain on this
# host's CPU. 3. The masked argmax alone. 4. The constrained decode at 64/256, three pairs per
# configuration: the default fill against executor:8, and the fused argmax for every
# constrained step against none (FUSED_ARGMAX_ROWS 1 / 10**9; the default is 128).
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1; R=docs/results/s20/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 150 python -m pytest -q -m "" tests/kernels/test_bitmask.py tests/gpu/test_structured_cuda.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -1
timeout 60 python -m aserve.bench.host_step --constrained --tokenizer-dir .gpu --fill executor:4 --batches 256 --steps 60 --out $OUT/host_step.json 2>&1 | tail -2
timeout 60 python $R/kernel_ab.py $OUT/kernel_ab.json 2>&1 | tail -6
structured() {  # $1 label, $2 FUSED_ARGMAX_ROWS, then env
  local t=$1 rows=$2; shift 2
  LEFT=$(( 580 - ($(date +%s) - S) )); [ $LEFT -gt 60 ] || return
  env "$@" timeout $LEFT python -c "
import sys, aserve.device.runner as r; r.FUSED_ARGMAX_ROWS = $rows
from aserve.bench.device_bench import main
sys.argv = ['device_bench', '--tokenizer-dir', '.gpu', '--only', 'structured', '--batches', '64,256',
            '--structured-repeats', '3', '--out', '$OUT/structured_$t.json']
main()" > /tmp/structured_$t.log 2>&1; echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured default 128 ASERVE_X=1
structured fill8 128 ASERVE_MASK_FILL=executor:8
structured fused_all 1 ASERVE_X=1
structured fused_none 1000000000 ASERVE_X=1
date -u; echo "took $(( $(date +%s) - S )) s"
