#!/bin/bash
# Which GPU tests fail (names, per file, with time bounds), then a short soak at 256 streams.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/*.whl
for f in tests/gpu/test_cuda_faults.py tests/gpu/test_cuda_engine.py tests/gpu/test_release_cuda.py tests/gpu/test_token_states_cuda.py tests/engine/test_prompt_logprobs.py; do
  timeout 100 python -m pytest -q -p no:cacheprovider -rfE $f > $OUT/$(basename $f).txt 2>&1; echo "$f rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/$(basename $f).txt | cut -c1-220 | tail -6
done
PYTHONPATH=$PWD python -c "from pathlib import Path; from aserve.bench.checkpoints import build_checkpoint; build_checkpoint('gemma3-270m', Path('/tmp/aserve-bench'), Path('.gpu'))" > $OUT/ckpt.log 2>&1; echo "ckpt rc=$?"
timeout 330 python -m loadgen soak --server-arg=--model --server-arg=/tmp/aserve-bench/gemma3-270m --duration 240 --concurrency 256 --abort-rate 0.1 --input-len 256 --output-len 128 --range-ratio 0.5 --sample-interval 5 --warmup-s 30 --no-progress --out $OUT/soak-h200 --label soak-h200 > $OUT/soak.log 2>&1; echo "soak rc=$?"
tail -25 $OUT/soak.log | cut -c1-200
