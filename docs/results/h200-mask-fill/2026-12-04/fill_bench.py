"""Host-only: mask fill per row for the structured bench's schema, Gemma vocabulary, along a
seeded random walk (fill, pick an allowed token, advance), by strategy and tokenizer form."""
import json, random, sys, time
import torch, llguidance
from aserve.tokenizer.loading import load_tokenizer
from aserve.sampling.grammar import Grammars, MaskFiller, mask_words, GrammarState, _grammar_text, allowed_tokens
from aserve.sampling_params import StructuredOutputs
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
tok = load_tokenizer(sys.argv[1]); V = 262144
gr = Grammars(tok, V); native_ll = gr._ll(); assert gr.native
callback_ll = gr._with_callback(llguidance)
text = _grammar_text(StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA))
out_rows = []
for rows in (64, 256):
    for form, ll in (("native", native_ll), ("callback", callback_ll)):
        tmpl = llguidance.LLMatcher(ll, text, log_level=0)
        specs = ["serial", "executor:2", "executor:4", "executor:8", "executor:16"] if form == "native" else ["serial", "executor:4"]
        for spec in specs:
            filler = MaskFiller(spec)
            states = [GrammarState(tmpl.deep_copy(), V) for _ in range(rows)]
            rng = random.Random(0); out = torch.empty((rows, mask_words(V)), dtype=torch.int32)
            tf = ta = 0.0; n = 0
            for step in range(30):
                t0 = time.perf_counter(); filler.fill(states, out.data_ptr(), mask_words(V) * 4); t1 = time.perf_counter()
                bits = allowed_tokens(out, V)
                toks = torch.multinomial(bits.float(), 1, generator=torch.Generator().manual_seed(step)).flatten().tolist()
                t2 = time.perf_counter()
                for s, t in zip(states, toks): assert s.advance(t)
                t3 = time.perf_counter()
                if step >= 5: tf += t1 - t0; ta += t3 - t2; n += 1
            r = {"rows": rows, "tokenizer": form, "fill": spec, "fill_ms": tf / n * 1e3, "fill_us_row": tf / n / rows * 1e6, "advance_us_row": ta / n / rows * 1e6}
            out_rows.append(r); print(json.dumps(r), flush=True)
json.dump(out_rows, open(sys.argv[2], "w"), indent=1)
