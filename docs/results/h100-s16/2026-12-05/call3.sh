#!/bin/bash
# Session 16, call 3: W1 (Gemma shape, defaults) per-step timeline, HEAD (b5759d4, the decode
# batch) against c3d5801 (.gpu/base); py-spy (200 Hz, Python frames) over the batch run at 256
# (HEAD); py-spy over issue 14's served workload with 4 front ends (every process).
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl .gpu/opt/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
(cd .gpu/base && python setup.py build_ext --inplace > /tmp/b1.txt 2>&1 || cp /tmp/b1.txt $OUT/)
date -u
for t in head base head2; do D=$ROOT; [ $t = base ] && D=$ROOT/.gpu/base
  (cd $D && PYTHONPATH=$D timeout 100 python $ROOT/.gpu/w1_timeline.py $OUT/w1_$t.json 2>&1 | grep -E "tok/s|steps" | sed "s/^/$t /")
done
date -u
PYTHONPATH=$ROOT timeout 100 py-spy record -r 200 -f raw -o $OUT/batch_pyspy_raw.txt -- python -m aserve.bench.device_bench --tokenizer-dir .gpu --only batch --batches 256 --out $OUT/batch_pyspy.json > /tmp/bp.log 2>&1; echo "batch+py-spy rc=$?"; grep -E "^ *(run|batch) " /tmp/bp.log | cut -c1-170
date -u
LEFT=$(( 570 - ($(date +%s) - S) ))
[ $LEFT -gt 90 ] && PYTHONPATH=$ROOT timeout $LEFT py-spy record -r 100 --subprocesses -f raw -o $OUT/served_pyspy_raw.txt -- python -m aserve.bench.served --tokenizer-dir .gpu --api-workers 4 --requests 512 --concurrency 256 --len 256 --repeats 1 --rates "" --out $OUT/served.json > $OUT/served.log 2>&1; echo "served rc=$?"; grep -A6 "^run  " $OUT/served.log | cut -c1-215
gzip -f $OUT/*_raw.txt 2>/dev/null
date -u; echo "took $(( $(date +%s) - S )) s"
