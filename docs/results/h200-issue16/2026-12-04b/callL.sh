#!/bin/bash
# Session 2026-12-04 #3, call 3: split launch with the masks on llguidance's executor (default) vs one by one;
# the CUDA tests the runner's restructure touches.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
timeout 150 python -m aserve.bench.device_bench --only structured --batches 64,128,256 --out $OUT/structured-split-exec.json > $OUT/structured-split-exec.txt 2>&1; echo "split+executor rc=$?"; grep -E "^structured" $OUT/structured-split-exec.txt
ASERVE_MASK_THREADS=0 timeout 150 python -m aserve.bench.device_bench --only structured --batches 64,128,256 --out $OUT/structured-split-serial.json > $OUT/structured-split-serial.txt 2>&1; echo "split+serial rc=$?"; grep -E "^structured" $OUT/structured-split-serial.txt
timeout 280 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu/test_structured_cuda.py tests/gpu/test_token_states_cuda.py tests/gpu/test_cuda_engine.py tests/gpu/test_cuda_faults.py tests/engine/test_watchdog_backstop.py tests/sampling/test_fill_masks.py > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -12
