# Session 2026-12-04 #6, call 1: native grammar tokenizer; mask fill on llguidance's executor (host bench + structured bench).
set -u
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD
nproc; python -c "import os; print('affinity', len(os.sched_getaffinity(0)))"; cat /sys/fs/cgroup/cpu.max 2>/dev/null
for spec in serial executor:4 executor:8; do
ASERVE_MASK_FILL=$spec timeout 110 python -m aserve.bench.device_bench --only structured --batches 64,256 --out $OUT/struct_${spec/:/}.json > $OUT/struct_${spec/:/}.txt 2>&1; echo "struct $spec rc=$?"; grep -E "^structured|grammar_tokenizer" $OUT/struct_${spec/:/}.txt | cut -c1-200
done
timeout 150 python .gpu/fill_bench.py /tmp/aserve-bench/gemma3-270m $OUT/fill_bench.json > $OUT/fill_bench.txt 2>&1; echo "fill rc=$?"; cat $OUT/fill_bench.txt | tail -14 | cut -c1-200
