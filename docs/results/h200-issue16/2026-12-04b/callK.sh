#!/bin/bash
# Session 2026-12-04 #3, call 2: the split launch for constrained steps + the in-place bitmask kernel.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
timeout 240 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py tests/gpu/test_token_states_cuda.py tests/gpu/test_cuda_engine.py > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -12
timeout 150 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured-split.json > $OUT/structured-split.txt 2>&1; echo "split rc=$?"; grep -E "^structured" $OUT/structured-split.txt
ASERVE_SPLIT_MASKS=0 timeout 150 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured-nosplit.json > $OUT/structured-nosplit.txt 2>&1; echo "nosplit rc=$?"; grep -E "^structured" $OUT/structured-nosplit.txt
timeout 120 python -m aserve.bench.device_bench --only structured,profile --batches 64 --out $OUT/profile.json > $OUT/profile.txt 2>&1; echo "profile rc=$?"
grep -A28 "Ordered by: internal" $OUT/profile.txt | cut -c1-170
grep -A30 "Ordered by: cumulative" $OUT/profile.txt | cut -c1-170
