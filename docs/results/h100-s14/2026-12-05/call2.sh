#!/bin/bash
# Session 14, call 2: issue 14's served workload (4 front ends, 3 repeats) with the client fixes
# (processes start together, no /metrics scrape between go and send); py-spy on the core and one
# front end during the served runs; then the same with the front ends at nice 10.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl .gpu/opt/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; lscpu | grep -E "Model name|Thread|Core"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
( while ! pgrep -f "loadgen run --base-url" >/dev/null; do sleep 0.2; done
  CORE=$(pgrep -f "m aserve serve" | head -1); FE=$(pgrep -P $CORE -f spawn_main | head -1)
  echo "py-spy core=$CORE fe=$FE"
  py-spy record -p $CORE -d 20 -r 250 -f raw --threads --idle --nonblocking -o $OUT/core_raw.txt > /tmp/ps1.log 2>&1 &
  py-spy record -p $FE -d 20 -r 250 -f raw --nonblocking -o $OUT/fe_raw.txt > /tmp/ps2.log 2>&1 &
  wait; tail -2 /tmp/ps1.log /tmp/ps2.log ) &
timeout 200 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served_a.json > $OUT/served_a.log 2>&1; echo "served A rc=$?"; grep -A8 "^run  " $OUT/served_a.log
wait
date -u
ASERVE_FRONT_END_NICE=10 timeout 200 python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 3 --rates "" --out $OUT/served_b.json > /tmp/served_b.log 2>&1; echo "served B (FE nice 10) rc=$?"; grep -A8 "^run  " /tmp/served_b.log
date -u
python - <<'PY'
import json, os
for f in ("served_a.json", "served_b.json"):
    d = json.load(open(os.environ["OUT"] + "/" + f))
    for r in d["rows"]:
        if "core_busy" in r:
            print(f, f'{r["label"]:<34} {r["output_tok_s"]:>8,.0f} busy {r["device_busy_s"]:.2f} gap {r["device_gap_s"]:.2f} lag p99 {r["client_loop_lag_p99_ms"]:5.1f} ms spread {r["client_ready_spread_ms"]:6.0f} ms ttft p50 {r["ttft_p50_ms"]:5.0f} core {r["core_busy"]:.2f} FEs {[round(c, 2) for c in r["children_cpu_s"]]}')
PY
