#!/bin/bash
# Session 22, call 6 (NOT RUN: the session's device time ran out; for the next session): flag_wait.py (a device-side wait on a host-set flag: its release latency;
# the masked argmax reading its masks from pinned host memory). Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python docs/results/s22/2026-12-06/flag_wait.py --out $OUT/flag_wait.json 2>&1 | grep -v "^20..-" | tail -40
echo "rc=$? took $(( $(date +%s) - S )) s"
