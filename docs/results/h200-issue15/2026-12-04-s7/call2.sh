python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD
timeout 250 python -m pytest -m "" -q -x tests/gpu tests/attention -p no:cacheprovider 2>&1 | tail -8 | tee $OUT/gpu_tests.txt
timeout 300 python -m aserve.bench.device_bench --only copy,floor --attention-backend triton --out $OUT/floor.json 2>&1 | grep -v "^\[\|request_end\|^{" | tail -12
