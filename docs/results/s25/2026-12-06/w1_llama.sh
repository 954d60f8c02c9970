#!/bin/bash
# Session 25 (issue 15): W1 at the defaults with the fair peer, Llama 3.2 1B shape only, for the
# bar's machine (an H200): the H100 figure (session 18) was 30.6x against a 40x bar, with aserve
# device-bound there. Carry [".gpu", ".whl"].
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 560 python -m aserve.bench.device_bench --tokenizer-dir .gpu --only w1 --w1-shapes llama --w1-requests 1000 --out $OUT/w1_llama.json > $OUT/w1_llama.log 2>&1; echo "w1 rc=$?"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/w1_llama.json"))
for r in d.get("w1", []):
    a, p = r["aserve"], r["transformers"]
    print(r["shape"], "aserve", round(a["output_tok_s"]), "idle", a.get("device_idle_fraction"), "running", a.get("max_running_requests"),
          "peer", round(p["output_tok_s"]), "on", p.get("num_requests", p.get("requests")), "ratio", round(r["ratio"], 1))
PY
gzip -f $OUT/w1_llama.log; date -u; echo "took $(( $(date +%s) - S )) s"
