"""Session 25 (this VM): how many distinct masks a 256-row step of the structured bench's schema
fills, and how many of a row's 8,192 mask words are not zero (host_step's constrained steps,
every row a token its mask allows). PYTHONPATH=$PWD python distinct_masks.py"""
import aserve, anyio, torch, statistics
from aserve.bench import host_step
from aserve.bench.mask_fill import _tokenizer
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskFiller
import aserve.sampling.masks as M
tok = _tokenizer(".gpu")
grammars = Grammars(tok, tok.vocab_size, filler=MaskFiller("executor:2"))
orig = M.fill_masks
counts, nz = [], []
def fm(*a, **k):
    m = orig(*a, **k)
    counts.append(torch.unique(m, dim=0).shape[0])
    nz.append((m != 0).sum(1).float().mean().item())
    return m
host_step.fill_masks = fm
async def run():
    return host_step.bench_batch(256, 40, grammars=grammars)
anyio.run(run)
print("distinct masks per 256-row step:", counts[-40:])
print("nonzero words per row (mean):", round(statistics.mean(nz[-40:]),1))
