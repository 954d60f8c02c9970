#!/bin/bash
# Structured outputs and prompt logprobs on CUDA: GPU tests, then device_bench structured at batch 64 and 256.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/*.whl
python -c "import llguidance, jsonschema, tokenizers, transformers; print('deps ok', llguidance.__version__ if hasattr(llguidance,'__version__') else '', tokenizers.__version__, transformers.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -p no:cacheprovider tests/gpu tests/engine/test_prompt_logprobs.py tests/tokenizer/test_bpe_model.py -k "not server" > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$?"; tail -4 $OUT/gpu_tests.txt
timeout 300 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured.json > $OUT/structured.log 2>&1; echo "bench rc=$?"
grep "structured b=" $OUT/structured.log; tail -5 $OUT/structured.log | cut -c1-200
