#!/bin/bash
# Session 24, call 1 (issue 16): can a stream wait on a host flag in the GPU's front end?
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python -c "import torch; print(torch.__version__, torch.version.cuda)"
timeout 120 python docs/results/s24/2026-12-06/wait_value.py $OUT/wait_value.json
echo "rc=$?"
