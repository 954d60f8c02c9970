#!/bin/bash
# Session 2026-12-04 #3, call 4: the longest soak one command holds (7.5 min at 256 streams, serve GPU defaults).
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
PYTHONPATH=$PWD python -c "from pathlib import Path; from aserve.bench.checkpoints import build_checkpoint; build_checkpoint('gemma3-270m', Path('/tmp/aserve-bench'), Path('.gpu'))" > $OUT/ckpt.log 2>&1; echo "ckpt rc=$?"
timeout 545 python -m loadgen soak --server-arg=--model --server-arg=/tmp/aserve-bench/gemma3-270m --duration 450 --concurrency 256 --abort-rate 0.1 --input-len 256 --output-len 128 --range-ratio 0.5 --sample-interval 5 --warmup-s 30 --no-progress --out $OUT/soak-h200 --label soak-h200 > $OUT/soak.log 2>&1; echo "soak rc=$?"
tail -32 $OUT/soak.log | cut -c1-200
