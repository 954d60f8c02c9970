#!/bin/bash
# Session 2026-12-04 #5, call 6: batch 256/512 and W1 at HEAD (GC threshold, graph-path structured, helper's CPU changes).
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
timeout 100 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > $OUT/batch.txt 2>&1; echo "batch rc=$?"; tail -3 $OUT/batch.txt | cut -c1-300
PYTHONPATH=$PWD timeout 80 python .gpu/w1_timeline.py $OUT/w1_timeline.json > $OUT/w1_timeline.log 2>&1; echo "w1 rc=$?"
python .gpu/analyze_timeline.py $OUT/w1_timeline.json > $OUT/w1_analysis.txt; cat $OUT/w1_analysis.txt
date -u
