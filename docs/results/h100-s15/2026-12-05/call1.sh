#!/bin/bash
# Prepared in session 14 for the next session's first device call (ask for nvidia-h200; carry
# [".gpu", ".whl"]). Build .whl as ../shared/device.md says (starlette, hypercorn, h2, hpack,
# hyperframe, priority, wsproto, structlog, gguf, pyzmq, msgspec, llguidance, pydantic,
# pydantic-core, annotated-types, typing-inspection, pytest-asyncio, jsonschema,
# jsonschema-specifications, referencing, rpds-py; versions as in the venv) and
# .gpu/tokenizer.model from the default GGUF (aserve.tokenizer.gguf_proto.proto_from_gguf).
# 1. Issue 14 with spin as the default: served at 4 and 7 front ends, with client cores and the
#    host's busy share per row. 2. Issue 16 with spin: structured against free at 64 and 256.
# 3. Issue 15: the batch section at 256 and 512 (idle, gap). 4. The GPU suite in what is left.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 230 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4,7 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A12 "^run  " $OUT/served.log
date -u
timeout 120 python -m aserve.bench.device_bench --only structured --batches 64,256 --structured-repeats 2 --out $OUT/structured.json > /tmp/s.log 2>&1; echo "structured rc=$?"; grep -E "^structured" /tmp/s.log | cut -c1-200
date -u
timeout 90 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > /tmp/b.log 2>&1; echo "batch rc=$?"; grep -E "^ *(run|batch) " /tmp/b.log | cut -c1-170
date -u
LEFT=$(( 585 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
