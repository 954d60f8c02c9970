#!/bin/bash
# Session 2026-12-04 #5, call 5: mask fill serial vs threads on the decode-graph path.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
for spec in threads:4 serial threads:2; do
ASERVE_MASK_FILL=$spec timeout 90 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/struct_${spec/:/}.json > $OUT/struct_${spec/:/}.txt 2>&1; echo "struct $spec rc=$?"; grep -E "^structured" $OUT/struct_${spec/:/}.txt
done
date -u
