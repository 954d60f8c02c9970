#!/bin/bash
# Session 2026-12-04 #4, call 6: greedy prefill-graph steps without sampler inputs -- CUDA engine tests, then W1 Gemma twice.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
timeout 80 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu/test_cuda_engine.py -k "float32_greedy or sync" > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -6
for i in 1 2; do
PYTHONPATH=$PWD timeout 60 python .gpu/xgraph_ab.py $OUT/w1_gemma.json gemma3-270m 1000 graphs > $OUT/ab_$i.log 2>&1; echo "ab $i rc=$?"; grep -E "tok/s|Error|error" $OUT/ab_$i.log | cut -c1-700 | tail -3
done
date -u
