#!/bin/bash
# Session 2026-12-04 #5, call 4: constrained greedy rows on the decode-graph path (masked argmax) -- CUDA tests, structured bench, W1 once.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
timeout 150 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu/test_structured_cuda.py tests/kernels/test_bitmask.py tests/gpu/test_cuda_engine.py -k "not test_cuda_engine or float32_greedy or sync" > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -8
date -u
timeout 100 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured.json > $OUT/structured.txt 2>&1; echo "struct rc=$?"; grep -E "^structured" $OUT/structured.txt
date -u
PYTHONPATH=$PWD timeout 90 python .gpu/w1_timeline.py $OUT/w1_timeline.json > $OUT/w1_timeline.log 2>&1; echo "w1 rc=$?"
python .gpu/analyze_timeline.py $OUT/w1_timeline.json | head -2
date -u
