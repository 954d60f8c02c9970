#!/bin/bash
# Session 2026-12-04 #5, call 3: HEAD (GC threshold) W1 timeline x2, batch 256/512; served at HEAD and at b854f15 (the regression check).
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u; nproc; lscpu | grep -E "Model name|MHz" | head -3
for i in 1 2; do
PYTHONPATH=$PWD timeout 100 python .gpu/w1_timeline.py $OUT/w1_timeline$i.json > $OUT/w1_timeline$i.log 2>&1; echo "w1 rc=$?"
python .gpu/analyze_timeline.py $OUT/w1_timeline$i.json
done
date -u
timeout 110 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > $OUT/batch.txt 2>&1; echo "batch rc=$?"; tail -3 $OUT/batch.txt | cut -c1-300
date -u
(cd .gpu/base && PYTHONPATH=$PWD timeout 150 python -m aserve.bench.served --tokenizer-dir ../../.gpu --work-dir /tmp/aserve-bench --api-workers 4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 1 --rates "" --out $OUT/served_base.json > $OUT/served_base.log 2>&1; echo "served base rc=$?")
grep -A8 "^run  " $OUT/served_base.log | cut -c1-200
date -u
timeout 240 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 0,4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 1 --rates 512 --w3-requests 400 --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"
grep -A12 "^run  " $OUT/served.log | cut -c1-200
date -u
