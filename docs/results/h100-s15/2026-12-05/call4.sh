#!/bin/bash
# Session 15, call 4: where the engine's host step goes on this kind of host: py-spy (Python
# frames, 200 Hz) over the batch run at 256 and 512.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl .gpu/opt/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 200 py-spy record -r 200 -f raw -o $OUT/batch_pyspy_raw.txt -- python -m aserve.bench.device_bench --only batch --batches 256,512 --out $OUT/batch_pyspy.json > /tmp/bp.log 2>&1; echo "batch+py-spy rc=$?"; grep -E "^ *(run|batch) " /tmp/bp.log | cut -c1-170; grep py-spy /tmp/bp.log | tail -3
date -u
