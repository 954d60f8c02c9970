#!/bin/bash
# Session 2026-12-04 #5, call 2: after the host-step cuts -- W1 timeline, decode batch 256/512, issue 14 served + W3 at saturating rates.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
PYTHONPATH=$PWD timeout 100 python .gpu/w1_timeline.py $OUT/w1_timeline.json > $OUT/w1_timeline.log 2>&1; echo "w1 rc=$?"
python .gpu/analyze_timeline.py $OUT/w1_timeline.json
PYTHONPATH=$PWD timeout 100 python .gpu/w1_timeline.py $OUT/w1_timeline2.json > $OUT/w1_timeline2.log 2>&1; echo "w1 rc=$?"
python .gpu/analyze_timeline.py $OUT/w1_timeline2.json
date -u
timeout 110 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > $OUT/batch.txt 2>&1; echo "batch rc=$?"; tail -3 $OUT/batch.txt | cut -c1-300
date -u
timeout 330 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 0,4 --client-procs 4 --requests 512 --concurrency 256 --len 256 --repeats 1 --rates 128,512 --w3-requests 400 --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"
grep -E "tok/s|W3|idle" $OUT/served.log | tail -14 | cut -c1-220
date -u
timeout 90 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu/test_cuda_engine.py -k "float32_greedy or sync" > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -4
date -u
