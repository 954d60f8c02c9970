"""Fake-quant simulation: 8-bit activations (per 32-block, symmetric, round to nearest, as
llama.cpp's Q8_0 activations) on the head only / on every matmul, vs the gguf path's exact
float32 activations; teacher-forced top-1 agreement and perplexity on the quality corpus."""
import sys, math, json, torch
import aserve.kernels.gguf_linear as GL
from aserve.bench import quality as Q
from aserve.models.loader import load_model
torch.set_num_threads(2)
TOKENS = int(sys.argv[1])
real = GL.gguf_matmul
MODE = {"m": "none"}
def fq(x):
    xb = x.view(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    q = torch.where(d > 0, torch.round(xb / torch.where(d > 0, d, 1)), 0).clamp(-127, 127)
    return (q * d).view_as(x)
def bf(x): return x.to(torch.bfloat16).float()
def patched(x, blocks, qtype, in_features):
    m = MODE["m"]; head = blocks.shape[0] == 262144
    if m == "int8_head" and head: x = fq(x)
    elif m == "int8_all": x = fq(x)
    elif m == "bf16_head" and head: x = bf(x)
    return real(x, blocks, qtype, in_features)
GL.gguf_matmul = patched
tok_ids = None
from aserve.tokenizer.loading import load_tokenizer
from aserve.models.loader import resolve_model_path
tok = load_tokenizer(resolve_model_path("gemma-3-270m"))
ids = tok.encode(Q.corpus_text())
wins = Q.windows(ids, tok.bos_token_id, 512, TOKENS)
score = Q.aserve_scorer(True)
res = {}
for m in ("none", "int8_head", "bf16_head", "int8_all"):
    MODE["m"] = m
    lp, top, s = Q.run(m, score, wins)
    res[m] = (lp, top)
base_lp, base_top = res["none"]
for m, (lp, top) in res.items():
    ppl = math.exp(-float(lp.mean()))
    print(f"{m:>10}: ppl {ppl:.4f} ({(ppl / math.exp(-float(base_lp.mean())) - 1) * 100:+.3f}%), top-1 = exact's {float((top == base_top).double().mean()) * 100:.2f}% over {len(top)} positions")
