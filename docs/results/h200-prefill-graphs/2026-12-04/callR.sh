#!/bin/bash
# Session 2026-12-04 #4, call 3: decodes of mixed graph steps through the decode kernel -- GPU tests, then W1 A/B, each run in its own process.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
timeout 200 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/gpu tests/attention/test_triton.py tests/engine/test_prompt_logprobs.py > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/tests.txt | cut -c1-250 | tail -12
date -u
for shape in gemma3-270m llama3.2-1b; do for cfg in graphs decode-only graphs; do
PYTHONPATH=$PWD timeout 100 python .gpu/xgraph_ab.py $OUT/xgraph_ab.json $shape 1000 $cfg > $OUT/ab_${shape}_${cfg}.log 2>&1; echo "ab $shape $cfg rc=$?"; grep -E "tok/s|Error|error" $OUT/ab_${shape}_${cfg}.log | cut -c1-700 | tail -3
done; done
date -u
