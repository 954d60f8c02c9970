#!/bin/bash
# Session 14, call 3: awaiting CUDA events by polling at every pass of the loop (spin) against
# the 50 us poll (whose sleep lasts a millisecond on an idle asyncio loop). The new GPU test;
# issue 14's served workload with spin, then with poll, in one call; issue 15's batch section
# (decode gap, idle) at 256 and 512 with poll and spin.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
python - <<'PY'
import asyncio, time
async def main():
    d = []
    for _ in range(200):
        t = time.perf_counter(); await asyncio.sleep(50e-6); d.append(time.perf_counter() - t)
    d.sort(); print(f"asyncio.sleep(50us) on an idle loop here: p50 {d[100]*1e6:.0f} us, p90 {d[180]*1e6:.0f} us")
asyncio.run(main())
PY
timeout 90 python -m pytest -q -m "" tests/gpu/test_cuda_engine.py -k "every_cuda_event_wait or overlap_matches" > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
date -u
for w in spin poll; do
  timeout 165 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --engine-opt cuda_event_wait=$w --out $OUT/served_$w.json > /tmp/served_$w.log 2>&1; echo "served $w rc=$?"; grep -A8 "^run  " /tmp/served_$w.log
  date -u
done
for w in spin poll; do
  [ $(( $(date +%s) - S )) -lt 480 ] && timeout 90 python -m aserve.bench.device_bench --only batch --batches 256 --engine-opt cuda_event_wait=$w --out $OUT/batch_$w.json > /tmp/batch_$w.log 2>&1; echo "batch $w rc=$?"; grep -E "^ *(run|batch) " /tmp/batch_$w.log | cut -c1-170
  date -u
done
