"""Host-only: does mask fill scale over threads when rows come from K separately compiled
templates (K locks) instead of one? Realistic walk: fill, sample allowed tokens, advance."""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import torch, llguidance
from aserve.tokenizer.loading import load_tokenizer
from aserve.sampling.grammar import Grammars, mask_words, GrammarState, _grammar_text, allowed_tokens, _fill_rows
from aserve.sampling_params import StructuredOutputs
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
tok = load_tokenizer(sys.argv[1]); V = 262144
results = []
for form in ("native", "callback"):
    gr = Grammars(tok, V)
    ll = gr._ll() if form == "native" else gr._with_callback(llguidance)
    text = _grammar_text(StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA))
    W = mask_words(V) * 4
    for rows in (64, 256):
        for k, how in ((1, "serial"), (1, "threads"), (2, "threads"), (4, "threads"), (8, "threads"), (4, "executor"), (8, "executor")):
            if form == "callback" and how == "executor": continue
            if how == "threads" and k == 1: kt = 4
            else: kt = k
            tmpls = [llguidance.LLMatcher(ll, text, log_level=0) for _ in range(k)]
            states = [GrammarState(tmpls[i % k].deep_copy(), V) for i in range(rows)]
            groups = [list(range(j, rows, k)) for j in range(k)] if how == "threads" and k > 1 else None
            nthreads = kt if how != "serial" else 1
            pool = ThreadPoolExecutor(nthreads) if how == "threads" else None
            ex = llguidance.LLExecutor(k) if how == "executor" else None
            out = torch.empty((rows, mask_words(V)), dtype=torch.int32); base = out.data_ptr()
            def fill_group(idx):
                for i in idx:
                    states[i].matcher.unsafe_compute_mask_ptr(base + i * W, W)
            def fill():
                if how == "serial": _fill_rows(states, 0, rows, base, W)
                elif how == "executor": ex.unsafe_compute_mask_ptr([(s.matcher, i) for i, s in enumerate(states)], base, W, rows)
                else:
                    gs = groups if groups is not None else [list(range(j, rows, nthreads)) for j in range(nthreads)]
                    list(pool.map(fill_group, gs))
            tf = 0.0; n = 0
            for step in range(25):
                t0 = time.perf_counter(); fill(); t1 = time.perf_counter()
                bits = allowed_tokens(out, V)
                toks = torch.multinomial(bits.float(), 1, generator=torch.Generator().manual_seed(step)).flatten().tolist()
                for s, tk in zip(states, toks): assert s.advance(tk)
                if step >= 5: tf += t1 - t0; n += 1
            r = {"form": form, "rows": rows, "templates": k, "how": how, "threads": nthreads if how != "executor" else k, "fill_ms": round(tf / n * 1e3, 3), "us_row": round(tf / n / rows * 1e6, 2)}
            results.append(r); print(json.dumps(r), flush=True)
json.dump(results, open(sys.argv[2], "w"), indent=1)
