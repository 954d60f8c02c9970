import json, sys, statistics
d = json.load(open(sys.argv[1])); S = d["steps"]
print(d["shape"], f"{d['tok_s']:.0f} tok/s idle {d['idle']:.1%} steps {len(S)}")
# gap before step k = d_begin[k] - d_end[k-1]; host-late if the step's launch ended after the previous device end
late = {"plan+launch of this step": 0.0, "commit": 0.0, "other": 0.0}
tot_gap = 0.0; by_kind = {}
commits = [(s["t_commit"], s["t_commit"] + s["commit_s"]) for s in S]
for k in range(1, len(S)):
    a, b = S[k - 1], S[k]
    g = b["d_begin"] - a["d_end"]
    if g <= 2e-5 or b["after_idle"]:
        continue
    tot_gap += g
    kind = ("mixed" if b["dec"] < b["seqs"] else "decode") + "<-" + ("mixed" if a["dec"] < a["seqs"] else "decode")
    by_kind[kind] = by_kind.get(kind, 0.0) + g
    w0, w1 = a["d_end"], b["d_begin"]
    # host intervals inside the gap window
    pl = (b["t_launch"] - b["plan_s"], b["t_launch"] + b["launch_s"])
    ov = lambda iv: max(0.0, min(iv[1], w1) - max(iv[0], w0))
    x = ov(pl); late["plan+launch of this step"] += x
    c = sum(ov(iv) for iv in commits if iv[1] > w0 and iv[0] < w1); late["commit"] += c
    late["other"] += max(0.0, g - x - c)
busy = sum(s["d_end"] - s["d_begin"] for s in S)
print(f"busy {busy:.3f}s gaps {tot_gap:.3f}s  by kind:", {k: round(v, 3) for k, v in by_kind.items()})
print("host during gaps:", {k: round(v, 3) for k, v in late.items()})
for kind, sel in (("decode", lambda s: s["dec"] == s["seqs"]), ("mixed", lambda s: s["dec"] < s["seqs"])):
    r = [s for s in S if sel(s)]
    if not r: continue
    med = lambda f: statistics.median(f(s) for s in r) * 1e3
    print(f"{kind}: n={len(r)} busy p50 {med(lambda s: s['d_end']-s['d_begin']):.2f}ms plan {med(lambda s: s['plan_s']):.2f} launch {med(lambda s: s['launch_s']):.2f} commit {med(lambda s: s['commit_s']):.2f} tokens p50 {statistics.median(s['tok'] for s in r)} seqs p50 {statistics.median(s['seqs'] for s in r)}")
