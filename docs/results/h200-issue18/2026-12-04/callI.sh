#!/bin/bash
# The watchdog backstop on CUDA (a spinning kernel blocks the loop's thread), the CUDA fault suite, and the CUDA engine tests.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
timeout 200 python -m pytest -q -p no:cacheprovider -rfE -m "" tests/engine/test_watchdog_backstop.py tests/gpu/test_cuda_faults.py tests/gpu/test_cuda_engine.py > $OUT/t.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|^E " $OUT/t.txt | cut -c1-250 | tail -12
