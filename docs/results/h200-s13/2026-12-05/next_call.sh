#!/bin/bash
# Next session, first call (prepared in session 13). Build first:
#   rm -rf .gpu/branch && mkdir -p .gpu/branch && git archive next/fill-overlap aserve setup.py pyproject.toml tests | tar -x -C .gpu/branch
# 1. GPU suite at HEAD; 2. issue 14's served workload with the client no longer the limit (8 client
# processes by default, return_token_ids, CPU shares per run), 4 and 7 front ends; 3. issue 16's
# structured bench, HEAD against next/fill-overlap.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
(cd .gpu/branch && python setup.py build_ext --inplace > /tmp/bb.txt 2>&1 || cp /tmp/bb.txt $OUT/) &
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/; wait
date -u
PYTHONPATH=$ROOT timeout 150 python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
date -u
PYTHONPATH=$ROOT timeout 240 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4,7 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > /tmp/sh.log 2>&1; echo "served rc=$?"; grep -A12 "^run  " /tmp/sh.log
date -u
PYTHONPATH=$ROOT timeout 60 python -m aserve.bench.front_end --tokenizer-dir .gpu --streams 64,256 --tokens 256 --client-procs 2 --out $OUT/front_end.json 2>&1 | tail -4
date -u
for round in 1 2; do
  PYTHONPATH=$ROOT timeout 75 python -m aserve.bench.device_bench --only structured --batches 64,256 --structured-repeats 2 --out $OUT/struct_main_r$round.json > /tmp/m.log 2>&1; echo "struct main r$round rc=$?"; grep -E "^structured" /tmp/m.log | cut -c1-200
  (cd .gpu/branch && PYTHONPATH=$ROOT/.gpu/branch timeout 75 python -m aserve.bench.device_bench --tokenizer-dir $ROOT/.gpu --only structured --batches 64,256 --structured-repeats 2 --out $OUT/struct_branch_r$round.json > /tmp/b.log 2>&1; echo "struct branch r$round rc=$?"; grep -E "^structured" /tmp/b.log | cut -c1-200)
done
date -u
