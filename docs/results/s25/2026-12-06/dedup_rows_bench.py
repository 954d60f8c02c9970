"""Session 25 (this VM): the host cost of finding a step's duplicate masks (dedup_rows.c, built with
`gcc -O3 -march=native -shared -fPIC -o /tmp/dd/libdd.so dedup_rows.c`), on the masks of
host_step's constrained 256-row steps, and on 256 distinct dense rows."""
import aserve, anyio, torch, ctypes, time, statistics
from aserve.bench import host_step
from aserve.bench.mask_fill import _tokenizer
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskFiller
import aserve.sampling.masks as M
lib = ctypes.CDLL("/tmp/dd/libdd.so")
lib.dedup_rows.restype = ctypes.c_int64
lib.dedup_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
tok = _tokenizer(".gpu")
grammars = Grammars(tok, tok.vocab_size, filler=MaskFiller("executor:2"))
orig = M.fill_masks
saved = []
def fm(*a, **k):
    m = orig(*a, **k); saved.append(m.clone()); return m
host_step.fill_masks = fm
async def run(): return host_step.bench_batch(256, 30, grammars=grammars)
anyio.run(run)
times, us = [], []
idx = torch.empty(256, dtype=torch.int32)
for m in saved[-30:]:
    buf = m.clone()
    t0 = time.perf_counter(); u = lib.dedup_rows(buf.data_ptr(), buf.shape[0], buf.shape[1] // 2, idx.data_ptr()); times.append((time.perf_counter() - t0) * 1e6)
    us.append(u)
    assert torch.equal(buf[idx.long()], m), "dedup changed a mask"
print("distinct", us[:5], "dedup us median", round(statistics.median(times)), "min", round(min(times)))
# worst case: all rows distinct
m = torch.randint(-2**31, 2**31 - 1, (256, 8192), dtype=torch.int32); buf = m.clone()
t0 = time.perf_counter(); u = lib.dedup_rows(buf.data_ptr(), 256, 4096, idx.data_ptr()); t = (time.perf_counter() - t0) * 1e6
assert u == 256 and torch.equal(buf[idx.long()], m); print("all distinct (dense random):", round(t), "us")
