import time, torch, random
from aserve.tokenizer.loading import load_tokenizer
from aserve.models.loader import resolve_model_path
from aserve.sampling.grammar import Grammars, fill_masks, GrammarState, allowed_tokens
from aserve.sampling_params import StructuredOutputs
tok = load_tokenizer(resolve_model_path("gemma-3-270m")); V = 262144
gr = Grammars(tok, V)
schemas = {
 "extraction": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
   "city": {"enum": ["Paris", "Rome", "Oslo", "Berlin"]}, "employed": {"type": "boolean"}}, "required": ["name", "age", "city", "employed"]},
 "bench array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 200, "maxItems": 200},
}
for name, sch in schemas.items():
    so = StructuredOutputs(json=sch)
    for cached in (False, True):
        gr.masks._masks.clear()
        rows = [gr.state(so) if cached else GrammarState(gr.matcher(so), V) for _ in range(64)]
        rng = random.Random(0); tf = 0.0; n = 0
        for step in range(24):
            live = [r for r in rows if not r.done]
            if not live: break
            t0 = time.perf_counter(); m = fill_masks(live); tf += time.perf_counter() - t0; n += 1
            al = allowed_tokens(m, V)
            for k, r in enumerate(live):
                ids = al[k].nonzero().flatten()
                # a model that mostly agrees: half the rows take the lowest allowed id, the rest random
                t = int(ids[0]) if k % 2 == 0 else int(ids[rng.randrange(len(ids))])
                r.advance(t)
        print(f"{name:>12} cache {'on ' if cached else 'off'}: {tf / n * 1e3:.2f} ms per step fill over {n} steps (64 rows); hits {gr.masks.hits} misses {gr.masks.misses}")
