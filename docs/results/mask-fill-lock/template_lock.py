"""Are deep copies of one compiled llguidance matcher serialized? 128 rows of the structured
bench's schema (an array of integers) on the default model's vocabulary, each along its own
seeded random walk; masks computed by 1 or 2 Python threads (rows split between them) and by
llguidance's executor, with every row a copy of one template or of two (row i of template i % 2).
Run: python docs/results/mask-fill-lock/template_lock.py (needs aserve's C extension built)."""
import sys, time, json, os, threading
import aserve, torch, llguidance
from aserve.bench.mask_fill import _tokenizer, SCHEMAS
from aserve.sampling.grammar import Grammars, mask_words, _grammar_text
from aserve.sampling_params import StructuredOutputs
tok = _tokenizer(None)
g = Grammars(tok, 262144, native_tokens=True); ll = g._ll()
spec = StructuredOutputs(json=SCHEMAS["int-array"])
txt = _grammar_text(spec)
walks = []  # each row's seeded random walk through the schema (30 allowed tokens)
import random
from aserve.sampling.grammar import allowed_tokens
for i in range(128):
    m = llguidance.LLMatcher(ll, txt, log_level=0); rng = random.Random(i); w = []
    one = torch.empty((1, mask_words(262144)), dtype=torch.int32)
    for _ in range(30):
        m.unsafe_compute_mask_ptr(one.data_ptr(), one.shape[1] * 4)
        ids = allowed_tokens(one, 262144)[0].nonzero().flatten(); w.append(int(ids[rng.randrange(len(ids))])); m.consume_token(w[-1])
    walks.append(w)
R = len(walks); V = 262144; W = mask_words(V)
out = torch.empty((R, W), dtype=torch.int32)
def make(mode):
    if mode == "one-template":
        t = llguidance.LLMatcher(ll, txt, log_level=0); return [t.deep_copy() for _ in range(R)]
    if mode == "two-templates":
        ts = [llguidance.LLMatcher(ll, txt, log_level=0) for _ in range(2)]; return [ts[i % 2].deep_copy() for i in range(R)]
def run(ms, nthreads, reps):
    tot = 0.0
    for rep in range(reps):
        cur = [m.deep_copy() for m in ms]
        for step in range(30):
            def work(k):
                for i in range(k, R, nthreads):
                    cur[i].unsafe_compute_mask_ptr(out[i].data_ptr(), W*4)
            a = time.perf_counter()
            if nthreads == 1: work(0)
            else:
                th = [threading.Thread(target=work, args=(k,)) for k in range(nthreads)]
                [t.start() for t in th]; [t.join() for t in th]
            tot += time.perf_counter() - a
            for i in range(R): cur[i].consume_token(walks[i][step])
    return tot / reps / 30 / R * 1e6
for mode in ("one-template", "two-templates"):
    ms = make(mode)
    run(ms, 1, 1)
    print(mode, "1 thread %.2f us/row" % run(ms, 1, 4), " 2 threads %.2f us/row" % run(ms, 2, 4), flush=True)
print("--- executor")
def run_exec(ms, ex, reps, order):
    tot = 0.0
    for rep in range(reps):
        cur = [m.deep_copy() for m in ms]
        for step in range(30):
            pairs = [(cur[i], i) for i in order]
            a = time.perf_counter()
            if ex is None:
                for i in order: cur[i].unsafe_compute_mask_ptr(out[i].data_ptr(), W*4)
            else:
                ex.unsafe_compute_mask_ptr(pairs, out.data_ptr(), W*4, R)
            tot += time.perf_counter() - a
            for i in range(R): cur[i].consume_token(walks[i][step])
    return tot / reps / 30 / R * 1e6
ex2 = llguidance.LLExecutor(2)
ts = [llguidance.LLMatcher(ll, txt, log_level=0) for _ in range(2)]
one = [ts[0].deep_copy() for i in range(R)]
two = [ts[i % 2].deep_copy() for i in range(R)]
by_shard = sorted(range(R), key=lambda i: i % 2)
run_exec(two, ex2, 1, by_shard)
print("one template, serial: %.2f" % run_exec(one, None, 4, list(range(R))))
print("one template, executor:2: %.2f" % run_exec(one, ex2, 4, list(range(R))))
print("two templates interleaved, executor:2: %.2f" % run_exec(two, ex2, 4, list(range(R))))
print("two templates sorted by template, executor:2: %.2f" % run_exec(two, ex2, 4, by_shard))
