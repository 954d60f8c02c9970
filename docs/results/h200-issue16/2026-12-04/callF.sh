#!/bin/bash
# GPU tests (faults' CUDA twin, prompt logprobs on CUDA, structured over BPE), then device_bench structured with the executor fill.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/*.whl
timeout 280 python -m pytest -q -p no:cacheprovider tests/gpu tests/engine/test_prompt_logprobs.py tests/tokenizer/test_bpe_model.py tests/engine/test_faults.py -k "not server" > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests.txt | tail -8
timeout 260 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured.json > $OUT/structured.log 2>&1; echo "bench rc=$?"
grep "structured b=" $OUT/structured.log
