#!/bin/bash
# Session 24, call 2 (issue 16): call 1's wait hung; variants, each with a deadline.
export PYTHONUNBUFFERED=1
timeout 100 python docs/results/s24/2026-12-06/wait_value2.py
echo "rc=$?"
