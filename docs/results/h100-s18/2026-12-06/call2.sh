#!/bin/bash
# Session 18, call 2 (prepared in session 17 as next_call_w1_peer.sh).
# Session 17, call 4: issue 15's W1 at the defaults with the fair peer (transformers
# generate_batch given as many requests as aserve runs at once), Gemma 3 270M shape only.
S=$(date +%s)
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ROOT=$PWD; export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
python setup.py build_ext --inplace > /tmp/b0.txt 2>&1 || cp /tmp/b0.txt $OUT/
date -u
timeout 390 python -m aserve.bench.device_bench --tokenizer-dir .gpu --only w1 --w1-shapes gemma --w1-requests 1000 --out $OUT/w1_peer.json > $OUT/w1_peer.log 2>&1; echo "w1 rc=$?"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/w1_peer.json"))
for r in d.get("w1", []):
    a, p = r["aserve"], r["transformers"]
    print(r["shape"], "aserve", round(a["output_tok_s"]), "idle", a.get("device_idle_fraction"), "running", a.get("max_running_requests"),
          "peer", round(p["output_tok_s"]), "on", p.get("num_requests", p.get("requests")), "ratio", round(r["ratio"], 1))
PY
date -u; echo "took $(( $(date +%s) - S )) s"
