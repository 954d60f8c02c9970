#!/bin/bash
# The issue-13 GPU round (2026-12-03 21:48-21:52 UTC, H200): the GPU tests on HEAD (snapshot .snap), then W2 before (.base = f8e91e7) and after, alternating.
cd "$(dirname "$0")/.."
root=$PWD
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -3; which pip python; python -m pip --version
python -c "import structlog, starlette, hypercorn, gguf, pydantic, prometheus_client, hypothesis, pytest_asyncio; print('deps ok')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch,triton;print('torch', torch.__version__, 'triton', triton.__version__)"
cd .snap
start=$(date +%s)
PYTHONPATH=$PWD timeout 240 python -m pytest -q tests/gpu tests/attention/test_triton.py tests/kernels --deselect tests/kernels/test_sm90_compile.py -p no:cacheprovider > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - start )) s"; tail -4 $OUT/gpu_tests.txt
for r in 1 2; do
  s=$(date +%s)
  (cd $root/.base && PYTHONPATH=$PWD timeout 120 python -m loadgen.device_bench --only w2 --tokenizer-dir $root/.gpu --out $OUT/w2_before_$r.json >> $OUT/w2.log 2>&1); echo "before $r rc=$? $(( $(date +%s) - s )) s"
  s=$(date +%s)
  (cd $root/.snap && PYTHONPATH=$PWD timeout 120 python -m aserve.bench.device_bench --only w2 --tokenizer-dir $root/.gpu --out $OUT/w2_after_$r.json >> $OUT/w2.log 2>&1); echo "after $r rc=$? $(( $(date +%s) - s )) s"
done
grep -h -A6 "overlap" $OUT/w2.log | tail -40
