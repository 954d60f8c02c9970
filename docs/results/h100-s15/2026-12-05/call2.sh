#!/bin/bash
# Session 15, call 2: where the engine's host step goes on the device host (py-spy, native
# frames, on the batch run at 256), the pure host step there (against this VM's), the release
# test with the cuBLAS workspace fix, and served with 4 front ends after the stats fix.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl .gpu/opt/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; lscpu | grep -E "Model name|MHz|Thread|Socket"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
python -m aserve.bench.host_step --batches 64,256,512 --steps 200 --out $OUT/host_step.json 2>&1 | tail -4
timeout 120 python -m pytest -q -m "" tests/gpu/test_release_cuda.py > $OUT/release.txt 2>&1; echo "release rc=$?"; tail -1 $OUT/release.txt
date -u
timeout 120 py-spy record -r 400 --native -f raw -o $OUT/batch_pyspy_raw.txt -- python -m aserve.bench.device_bench --only batch --batches 256 --out $OUT/batch_pyspy.json > /tmp/bp.log 2>&1; echo "batch+py-spy rc=$?"; grep -E "^ *(run|batch) " /tmp/bp.log | cut -c1-170; tail -3 /tmp/bp.log | cut -c1-200
timeout 90 python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch.json > /tmp/b.log 2>&1; echo "batch rc=$?"; grep -E "^ *(run|batch) " /tmp/b.log | cut -c1-170
date -u
LEFT=$(( 570 - ($(date +%s) - S) ))
timeout $LEFT python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A8 "^run  " $OUT/served.log
date -u
