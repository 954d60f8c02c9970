python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD
git log --oneline -1 2>/dev/null
timeout 300 python -m pytest -m "" -q tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/gpu_tests_head.txt
