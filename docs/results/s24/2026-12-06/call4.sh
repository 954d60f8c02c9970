#!/bin/bash
# Session 24, call 4 (issue 16): call 3 showed the device busy 94% in constrained runs with
# 2.37 ms of device time a step against 1.48 free at 256 rows: where does it go? torch.profiler
# over a free and a constrained run at 256 rows, and the masks' H2D copy alone.
# Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=docs/results/s24/2026-12-06
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
timeout 300 python $R/device_profile.py --tokenizer-dir .gpu --batch 256 --out $OUT/profile256.json 2>&1 | grep -v "^20..-"
echo "rc=$? took $(( $(date +%s) - S )) s"
