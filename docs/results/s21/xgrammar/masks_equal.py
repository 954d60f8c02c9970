"""Session 21: llguidance's and xgrammar's masks for the structured bench's schema, row by row
along 16 seeded walks of 40 steps, aserve's JSON layout given to both (compact separators ", "
and ": ", no free whitespace). Printed: rows whose masks differ and the tokens only one allows.
Run with xgrammar importable (PYTHONPATH=<unpacked wheels>)."""

import aserve, json, torch, xgrammar as xgr
from aserve.bench import mask_fill as mf
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskFiller, mask_words
from aserve.sampling_params import StructuredOutputs
mf.STEPS = 40
tok = mf._tokenizer(None); V = 262144
g = Grammars(tok, V, native_tokens=True); spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
walks = mf.record_walks(g, spec, 16)
tb = tok.token_bytes()
info = xgr.TokenizerInfo([tb[i] for i in range(V)], xgr.VocabType.RAW, vocab_size=V, stop_token_ids=list(tok.eos_token_ids))
comp = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(STRUCTURED_BENCH_SCHEMA), any_whitespace=False, separators=(", ", ": "))
states = [g.state(spec, MaskFiller("serial"), cached=False) for _ in walks]
ms = [xgr.GrammarMatcher(comp) for _ in walks]
a = torch.empty((len(walks), mask_words(V)), dtype=torch.int32); b = xgr.allocate_token_bitmask(len(walks), V)
diff_rows = 0; total = 0; extra_x = 0; extra_l = 0
for step in range(mf.STEPS):
    MaskFiller("serial").fill(states, a.data_ptr(), mask_words(V) * 4)
    for i, m in enumerate(ms): m.fill_next_token_bitmask(b, i)
    for i in range(len(walks)):
        total += 1
        if not torch.equal(a[i], b[i]):
            diff_rows += 1
            la = aserve.sampling.masks.allowed_tokens(a[i:i+1], V)[0]; lb = aserve.sampling.masks.allowed_tokens(b[i:i+1], V)[0]
            extra_x += int((lb & ~la).sum()); extra_l += int((la & ~lb).sum())
            if diff_rows <= 3:
                print('step', step, 'row', i, 'llg allowed', int(la.sum()), 'xgr allowed', int(lb.sum()),
                      'only xgr e.g.', [tb[t] for t in (lb & ~la).nonzero().flatten()[:5].tolist()],
                      'only llg e.g.', [tb[t] for t in (la & ~lb).nonzero().flatten()[:5].tolist()])
    for i, w in enumerate(walks):
        states[i].advance(w[step]); assert ms[i].accept_token(w[step])
print('rows differing', diff_rows, 'of', total, 'tokens only xgrammar allows', extra_x, 'only llguidance', extra_l)
