#!/bin/bash
# Session 20, call 2 (issue 16), run at 2752ee4: the fused masked argmax (82a2896) and the masks
# filled beside the commit before (8cc898e) against d8351c0 (.gpu/before) and 82a2896 alone
# (.gpu/fused). Its masked argmax was wrong on the H100 (fixed in 9fa1211). 1. The kernel and
# structured GPU tests. 2. The kernel alone (kernel_ab.py). 3. Where a constrained step's time goes at 256
# (profile_structured.py: host parts timed in the loop; kernels by torch.profiler). 4. The
# constrained decode at 64/256, before and after, at the default fill and at executor:8.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1; R=docs/results/s20/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/before && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/) &
(cd .gpu/fused && python setup.py build_ext --inplace > /tmp/b2.txt 2>&1 || cp /tmp/b2.txt $OUT/) &
wait
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -m "" tests/kernels/test_bitmask.py tests/gpu/test_structured_cuda.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
PYTHONPATH=$ROOT timeout 60 python $R/kernel_ab.py $OUT/kernel_ab.json 2>&1 | tail -8
PYTHONPATH=$ROOT timeout 150 python $R/profile_structured.py --tokenizer-dir .gpu --out $OUT/profile_structured.json > $OUT/profile_structured.log 2>&1; echo "profile rc=$?"; grep -v "request_end\|phase_done\|engine_started\|grammar_tok\|Writing" $OUT/profile_structured.log | head -24; gzip $OUT/profile_structured.log
structured() {  # $1 label, $2 tree, then env
  local t=$1 D=$2; shift 2
  LEFT=$(( 575 - ($(date +%s) - S) )); [ $LEFT -gt 40 ] || return
  (cd $D && env PYTHONPATH=$D "$@" timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1; echo "structured $t rc=$?"; grep "^structured b=" /tmp/structured_$t.log; gzip -c /tmp/structured_$t.log > $OUT/structured_$t.log.gz)
}
structured after $ROOT ASERVE_X=1
structured before $ROOT/.gpu/before ASERVE_X=1
structured after_fill8 $ROOT ASERVE_MASK_FILL=executor:8
structured before_fill8 $ROOT/.gpu/before ASERVE_MASK_FILL=executor:8
structured fused_fill8 $ROOT/.gpu/fused ASERVE_MASK_FILL=executor:8
date -u; echo "took $(( $(date +%s) - S )) s"
