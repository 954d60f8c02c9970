python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD
for v in default 64,4,2 default; do
  if [ $v = default ]; then unset ASERVE_DECODE_LAUNCH; else export ASERVE_DECODE_LAUNCH=$v; fi
  echo "== ASERVE_DECODE_LAUNCH=$v"
  timeout 170 python -m aserve.bench.device_bench --only copy,floor --attention-backend triton --out $OUT/floor_${v}_$RANDOM.json 2>&1 | grep "decode step"
done
