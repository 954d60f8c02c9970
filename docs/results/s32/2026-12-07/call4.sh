#!/bin/bash
# Session 32, call 4 (issue 15): the decode attention's grid with a token's KV heads side by side
# (ASERVE_DECODE_GRID=heads: (KV heads, batch, splits), so the programs reading one token's
# heads, which lie together in the cache, run at the same time) against the defaults (batch
# first). Llama 3.2 1B's shape has 8 KV heads; Gemma 3 270M's one (no change expected there).
# The attention tests first, then the decode step against its floor taking turns, then Llama's
# decode runs at 64 / 256 / 512. Carry [".gpu", ".whl"].
S=$(date +%s); BUDGET=${BUDGET:-400}
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
left() { echo $(( BUDGET - ($(date +%s) - S) )); }
timeout 100 python -m pytest -q -m "" tests/attention > $OUT/attention_tests.txt 2>&1
echo "attention tests rc=$? after $(( $(date +%s) - S )) s"; grep -E "passed|failed" $OUT/attention_tests.txt | tail -2; grep -E "^(FAILED|ERROR)" $OUT/attention_tests.txt | head -5
floor() {  # $1 label, then VAR=value settings
  local t=$1 L=$(left); shift
  [ $L -gt 40 ] || { echo "floor $t skipped: $L s left"; return; }
  env "$@" timeout $L python -m aserve.bench.device_bench --only copy,floor --attention-backend triton \
    --out $OUT/floor_$t.json > /tmp/floor_$t.log 2>&1
  echo "== $t ($*) rc=$? after $(( $(date +%s) - S )) s"; grep -E "decode step" /tmp/floor_$t.log; grep -E "Error" /tmp/floor_$t.log | tail -3
}
floor rows1 ASERVE_DECODE_GRID=rows
floor heads1 ASERVE_DECODE_GRID=heads
floor rows2 ASERVE_DECODE_GRID=rows
floor heads2 ASERVE_DECODE_GRID=heads
for m in heads rows; do
  L=$(left); [ $L -gt 40 ] || break
  ASERVE_DECODE_GRID=$m timeout $L python -m aserve.bench.device_bench --only batch --batches 64,256,512 --batch-shapes llama \
    --out $OUT/batch_llama_$m.json > /tmp/b_$m.log 2>&1
  echo "== batch llama $m rc=$? after $(( $(date +%s) - S )) s"; grep -E "run +tok/s|batch llama" /tmp/b_$m.log | tail -4; grep Error /tmp/b_$m.log | tail -2
done
date -u; echo "took $(( $(date +%s) - S )) s"
