#!/bin/bash
# Ran at cac6bdd (reverted by fc84bd8; its code and test live in that commit).
# Session 32, call 1 (issue 15): the decode graph as two half batches on two streams
# (aserve/device/decode_graphs.py, Halves; ASERVE_DECODE_HALVES). First the halves' tests on
# CUDA (each half's logits, tokens and K/V bit for bit what the model computes on that half
# alone), then the decode step against its floor (graph replays, both shapes, batch 256,
# context 1024) taking turns: off, turns (the halves' attention kernels alternate), free (no
# events between the halves), off again. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-560}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 150 python -m pytest -q -m "" tests/device/test_decode_halves.py > $OUT/halves_tests.txt 2>&1
echo "halves tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/halves_tests.txt | tail -3; grep -E "^(FAILED|ERROR)|Error" $OUT/halves_tests.txt | head -8
for mode in ${MODES:-0 turns free 0}; do
  L=$(left); [ $L -gt 60 ] || { echo "floor $mode skipped: $L s left"; continue; }
  ASERVE_DECODE_HALVES=$mode timeout $L python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_${mode}_$RANDOM.json > /tmp/floor_$mode.log 2>&1
  echo "== ASERVE_DECODE_HALVES=$mode rc=$? after $(( $(date +%s) - S )) s"; grep -E "copy bandwidth|decode step" /tmp/floor_$mode.log; grep -E "Error" /tmp/floor_$mode.log | tail -3
done
date -u; echo "took $(( $(date +%s) - S )) s"
