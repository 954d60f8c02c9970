set -x
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
nproc; cat /proc/cpuinfo | grep "model name" | head -1
timeout 520 python -m aserve.bench.decode_kernels --out $OUT/decode_kernels.json 2>&1 | grep -v "^{" | tail -80
cp -r /tmp/aserve-bench/*.json $OUT/ 2>/dev/null; true
