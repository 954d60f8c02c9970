#!/bin/bash
# Session 2026-12-04 #4, call 4: W1 at the defaults with the fair peer (transformers generate_batch given 256 requests), both shapes.
python -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl 2>&1 | grep -v WARNING | tail -2
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-deps --no-index --break-system-packages .gpu/opt/tokenizers-*.whl
date -u
timeout 575 python -m aserve.bench.device_bench --only w1 --w1-shapes gemma,llama --w1-requests 1000 --tokenizer-dir .gpu --out $OUT/w1.json > $OUT/w1.log 2>&1; echo "w1 rc=$?"
python - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/w1.json")).get("w1", []):
    a, p = r["aserve"], r["transformers"]
    print(r["shape"], f"aserve {a['output_tok_s']:.0f} tok/s idle {a['device_idle_fraction']:.1%} gap {a['median_decode_gap_us']} us sizes {a['max_running_requests']}/{a['max_num_batched_tokens']}; peer {p['output_tok_s']:.0f} ({p.get('requests')} req); ratio {r['ratio']:.1f}x")
PY
date -u
