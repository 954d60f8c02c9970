#!/bin/bash
# Session 2026-12-04 #3, call 1: the watchdog backstop's CUDA case after its last fix; the structured
# baseline with the grammar warmed; a cProfile of the constrained run at batch 64.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
timeout 150 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/engine/test_watchdog_backstop.py > $OUT/backstop.txt 2>&1; echo "backstop rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/backstop.txt | cut -c1-250 | tail -8
timeout 200 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/structured.json > $OUT/structured.txt 2>&1; echo "bench rc=$?"; grep -E "^structured" $OUT/structured.txt
timeout 150 python -m aserve.bench.device_bench --only structured,profile --batches 64 --out $OUT/profile.json > $OUT/profile.txt 2>&1; echo "profile rc=$?"
grep -A45 "Ordered by: internal" $OUT/profile.txt | head -50 | cut -c1-200
