#!/bin/bash
# Session 23, call 1 (issue 16): 1. sampler_graph.py (a split step's sampler launch, eager against
# one CUDA graph; the masked argmax reading pinned masks; a spin kernel's release on a pinned
# flag). 2. The GPU suite. 3. The structured bench with the masked-argmax
# graphs (ASERVE_SAMPLER_GRAPH=1, the default) and without (0), taking turns.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s23/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 150 python $R/sampler_graph.py --out $OUT/sampler_graph.json 2>&1 | grep -v "^20..-" | tail -45
timeout 200 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -5
structured() {  # $1 label, $2 ASERVE_SAMPLER_GRAPH
  local t=$1 g=$2
  LEFT=$(( 570 - ($(date +%s) - S) ))
  [ $LEFT -gt 90 ] || { echo "structured $t skipped: $LEFT s left"; return; }
  ASERVE_SAMPLER_GRAPH=$g timeout $LEFT python -m aserve.bench.device_bench --tokenizer-dir .gpu --only structured \
    --batches 64,256 --structured-repeats 3 --out $OUT/structured_$t.json > /tmp/structured_$t.log 2>&1
  echo "structured $t rc=$? rejected=$(grep -c grammar_rejected /tmp/structured_$t.log)"; grep "^structured b=" /tmp/structured_$t.log
}
structured graph1 1
structured eager1 0
structured graph2 1
structured eager2 0
date -u; echo "took $(( $(date +%s) - S )) s"
