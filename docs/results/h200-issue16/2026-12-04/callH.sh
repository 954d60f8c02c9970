#!/bin/bash
# The D2H staging fix (logprobs on CUDA, prompt logprobs on CUDA), and where the loop sits during the stall test.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
timeout 120 python -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_cuda_engine.py tests/engine/test_prompt_logprobs.py > $OUT/t1.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|passed|failed|^E " $OUT/t1.txt | cut -c1-200 | tail -8
timeout 120 python -m pytest -q -s -p no:cacheprovider -rfE "tests/gpu/test_cuda_faults.py::test_a_stalled_kernel_trips_the_watchdog_and_close_does_not_wait_for_it[poll]" > $OUT/t2.txt 2>&1; echo "rc=$?"
grep -B2 -A22 "Thread 0x\|Current thread" $OUT/t2.txt | head -80
