#!/bin/bash
# Session 2026-12-04 #5, call 1: W1 timeline (where the device idles), decode batch 256/512, structured mask-fill strategies.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u; nproc
PYTHONPATH=$PWD timeout 100 python .gpu/w1_timeline.py $OUT/w1_timeline.json > $OUT/w1_timeline.log 2>&1; echo "w1 rc=$?"; grep "tok/s" $OUT/w1_timeline.log | tail -1
python .gpu/analyze_timeline.py $OUT/w1_timeline.json
date -u
timeout 110 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > $OUT/batch.txt 2>&1; echo "batch rc=$?"; tail -12 $OUT/batch.txt | cut -c1-300
date -u
for spec in threads:4 serial threads:8; do
ASERVE_MASK_FILL=$spec timeout 100 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/struct_${spec/:/}.json > $OUT/struct_${spec/:/}.txt 2>&1; echo "struct $spec rc=$?"; grep -E "^structured" $OUT/struct_${spec/:/}.txt
done
date -u
timeout 80 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu/test_structured_cuda.py > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -6
date -u
