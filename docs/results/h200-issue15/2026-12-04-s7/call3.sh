python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD
timeout 200 python -m aserve.bench.device_bench --only copy,floor --attention-backend triton --out $OUT/floor.json 2>&1 | grep "decode step\|copy band"
timeout 200 python -m aserve.bench.decode_kernels --only step --out $OUT/step_profile.json 2>&1 | grep -v "request_end\|^{\|^20" | tail -50
timeout 150 python -m aserve.bench.decode_kernels --only sweep --batches 64 --block-n 32,64 --warps 4 --stages 2,3 --splits 0,1,2,4,8 --out $OUT/sweep64.json 2>&1 | grep -v "^{" | tail -40
