#!/bin/bash
# Session 18, call 3: issue 15's W1 at the defaults with the fair peer, Llama 3.2 1B shape; then the GPU suite at HEAD.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 330 python -m aserve.bench.device_bench --tokenizer-dir .gpu --only w1 --w1-shapes llama --w1-requests 1000 --out $OUT/w1_peer_llama.json > $OUT/w1_peer_llama.log 2>&1; echo "w1 rc=$?"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/w1_peer_llama.json"))
for r in d.get("w1", []):
    a, p = r["aserve"], r["transformers"]
    print(r["shape"], "aserve", round(a["output_tok_s"]), "idle", a.get("device_idle_fraction"), "running", a.get("max_running_requests"),
          "peer", round(p["output_tok_s"]), "on", p.get("num_requests", p.get("requests")), "ratio", round(r["ratio"], 1))
PY
date -u
LEFT=$(( 560 - ($(date +%s) - S) ))
[ $LEFT -gt 60 ] && timeout $LEFT python -m pytest -q -m "" tests/gpu tests/attention tests/kernels/test_bitmask.py tests/models/test_head_dtype.py > $OUT/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt; grep -E "FAILED|Error" $OUT/gpu_tests.txt | head
date -u; echo "took $(( $(date +%s) - S )) s"
