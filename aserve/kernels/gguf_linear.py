"""Linear layers and embeddings that run on a GGUF file's own quantized blocks (CPU).

The weight stays as llama.cpp wrote it (``[rows, row_bytes]`` uint8, Q8_0 / Q5_0 / Q4_K /
Q6_K; the embedding and LM head), or, for a layer's projections, in a repacked layout
holding the same weights bit for bit (int8 quants and float scales: no bit unpacking per
call, 1.06-1.6x the bytes); ``_ggufmm`` (a small C extension, built with the package)
multiplies float32 activations by it without a float32 copy of the weight. Few rows (decode, the LM head):
the kernel. Many rows (prefill): the weight is dequantized once per call into a scratch
buffer and torch's sgemm runs, since a GEMM of hundreds of rows is compute bound and MKL
is faster than our dot products there; the scratch lives for the call only.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
from torch import nn

# ggml type ids (gguf.GGMLQuantizationType) the kernel reads.
QTYPES = {"Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
# The ids of their repacked layouts (aserve's own, see "Repacked layouts" in _ggufmm.c):
# the same weights bit for bit, laid out so a decode step's matmul does not unpack bits.
REPACKED = {6: 1006, 8: 1006, 12: 1012, 14: 1014}  # Q8_0's quants fit Q5_0's repacked layout
# Q8_0 in groups of 16 rows: the int8 head's layout (set_int8_activations), same weights.
Q8_0X16 = 1008
# Rows of activations from which a call dequantizes the weight and runs sgemm instead.
GEMM_MIN_ROWS = 32
# Rows of the weight dequantized per sgemm (bounds the scratch: 16384 x 640 floats = 40 MB).
_GEMM_CHUNK_ROWS = 16384

# Bumped whenever a GGUFLinear changes how it multiplies (its flags or its blocks): plans that
# hold its pointers and flags (cpu_ops.decoder_stack) are rebuilt when it moves.
generation = 0

_kernel: ModuleType | None = None
_kernel_error: str | None = None


def kernel() -> ModuleType | None:
    """The compiled extension, or None when the install could not build it (no compiler)."""
    global _kernel, _kernel_error
    if _kernel is None and _kernel_error is None:
        try:
            # torch first: its libgomp then serves the extension too (one OpenMP thread pool).
            _kernel = importlib.import_module("aserve.kernels._ggufmm")
        except ImportError as exc:
            _kernel_error = str(exc)
    return _kernel


def unavailable_reason() -> str | None:
    """Why ``kernel()`` is None (None when it loaded)."""
    kernel()
    return _kernel_error


def _k() -> ModuleType:
    k = kernel()
    if k is None:
        raise RuntimeError(f"aserve's GGUF CPU kernel is not built: {_kernel_error}")
    return k


def row_bytes(qtype: int, in_features: int) -> int:
    return int(_k().row_bytes(qtype, in_features))


def gguf_matmul(
    x: torch.Tensor, blocks: torch.Tensor, qtype: int, in_features: int, gemm_bf16: bool = False
) -> torch.Tensor:
    """x: [M, in] float32 -> [M, out] float32, ``x @ W.T`` for W stored as ``blocks`` [out, row_bytes].

    ``gemm_bf16``: a call of ``GEMM_MIN_ROWS`` rows and more (a prefill) multiplies in bfloat16
    (x and the dequantized weight rounded to bfloat16, float32 accumulation in torch's oneDNN
    matmul, the result rounded to bfloat16: ~2.4x float32's speed where the CPU has AVX-512
    BF16). Fewer rows stay float32 here; a decode step of 7-31 streams run by
    ``cpu_ops.decoder_stack`` takes the kernel's bfloat16 tiles under the same flag."""
    assert x.dtype == torch.float32 and x.device.type == "cpu", f"want float32 on CPU, got {x.dtype} on {x.device}"
    x = x.contiguous()
    m, n = x.shape[0], blocks.shape[0]
    if m >= GEMM_MIN_ROWS:
        dtype = torch.bfloat16 if gemm_bf16 else torch.float32  # .to(): a no-op for float32
        xc = x.to(dtype)
        parts = [xc @ dequantize_rows(blocks[s : s + _GEMM_CHUNK_ROWS], qtype, in_features).to(dtype).t()
                 for s in range(0, n, _GEMM_CHUNK_ROWS)]  # fmt: skip
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).float()
    y = torch.empty(m, n, dtype=torch.float32)
    _k().matmul(qtype, blocks.data_ptr(), n, in_features, x.data_ptr(), m, y.data_ptr(), torch.get_num_threads())
    return y


def repack(blocks: torch.Tensor, qtype: int, in_features: int) -> tuple[torch.Tensor, int]:
    """Q5_0 / Q8_0 / Q4_K / Q6_K blocks [rows, row_bytes] -> (the same weights in the kernel's repacked
    layout [rows, row_bytes'], its id ``REPACKED[qtype]``)."""
    assert blocks.is_contiguous() and blocks.dtype == torch.uint8, "blocks must be contiguous uint8"
    to = REPACKED[qtype]
    out = torch.empty(blocks.shape[0], row_bytes(to, in_features), dtype=torch.uint8)
    got = _k().repack(qtype, blocks.data_ptr(), blocks.shape[0], in_features, out.data_ptr())
    assert got == to, (got, to)
    return out, to


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] float32 (K a multiple of 32) -> (xq int8 [M, K], xd float32 [M, K / 32]):
    llama.cpp's Q8_0 activations, per block of 32: xd = max|x| / 127, xq = round(x / xd)."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = xb.abs().amax(dim=-1)
    xd = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.round(xb * inv[..., None]).clamp_(-127, 127).to(torch.int8).reshape(m, k)
    return xq, xd.contiguous()


def q8_0_matmul_int8(
    x: torch.Tensor, blocks: torch.Tensor, in_features: int, qtype: int = QTYPES["Q8_0"]
) -> torch.Tensor:
    """x: [M, in] float32 -> [M, out] float32: ``x @ W.T`` for Q8_0 ``blocks`` (``qtype`` Q8_0, or
    ``Q8_0X16``: the same weights in groups of 16 rows, ``repack_q8_0x16``) with x rounded to 8
    bits per block of 32 (``quantize_activations``) and each block's dot product taken in
    integers (AVX-512 VNNI where the CPU has it). Row r of the result depends on row r of x
    only, whatever M is, whichever copy of the kernel runs and in either layout."""
    assert x.dtype == torch.float32 and x.device.type == "cpu", f"want float32 on CPU, got {x.dtype} on {x.device}"
    xq, xd = quantize_activations(x.contiguous())
    m, n = x.shape[0], blocks.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    entry = _k().matmul_q8_0x16_i8 if qtype == Q8_0X16 else _k().matmul_q8_0_i8
    entry(blocks.data_ptr(), n, in_features, xq.data_ptr(), xd.data_ptr(), m, y.data_ptr(), torch.get_num_threads())
    return y


def q8_0x16_argmax_int8(x: torch.Tensor, blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """x: [M, in] float32 -> [M] int64: ``q8_0_matmul_int8(x, blocks, in_features, Q8_0X16)
    .argmax(-1)`` (the first index among equal maxima) without the [M, out] logits ever being
    written: a greedy step's LM head."""
    return q8_0x16_topk_int8(x, blocks, in_features, 1)[1][:, 0]


def q8_0x16_topk_int8(
    x: torch.Tensor, blocks: torch.Tensor, in_features: int, t: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, in] float32 -> (values [M, t] float32, indices [M, t] int64): each row's ``t``
    largest of ``q8_0_matmul_int8(x, blocks, in_features, Q8_0X16)``, the same bits, in no
    particular order, without the [M, out] logits ever being written (a top-k step's LM head).
    Which of several equal values at the t-th place are kept is unspecified, and a logit of -inf
    may be left out (its slot: -inf at index -1); ``t = 1`` is torch.argmax's answer."""
    assert x.dtype == torch.float32 and x.device.type == "cpu", f"want float32 on CPU, got {x.dtype} on {x.device}"
    if not 0 < t <= blocks.shape[0]:
        raise ValueError(f"q8_0x16_topk_int8: t = {t} must lie in 1 .. {blocks.shape[0]} (the weight's rows)")
    xq, xd = quantize_activations(x.contiguous())
    vals = torch.empty(x.shape[0], t, dtype=torch.float32)
    idx = torch.empty(x.shape[0], t, dtype=torch.int64)
    _k().matmul_q8_0x16_i8(blocks.data_ptr(), blocks.shape[0], in_features, xq.data_ptr(), xd.data_ptr(),
                           x.shape[0], vals.data_ptr(), torch.get_num_threads(), t, idx.data_ptr())  # fmt: skip
    return vals, idx


def repack_q8_0x16(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """Q8_0 blocks [rows, row_bytes] (rows a multiple of 16) -> the same weights in groups of 16
    rows (``Q8_0X16``, same shape and size): the int8 matmul loads a block's weights once for
    every row of x (see "Q8_0 in groups of 16 rows" in _ggufmm.c)."""
    assert blocks.is_contiguous() and blocks.dtype == torch.uint8, "blocks must be contiguous uint8"
    out = torch.empty_like(blocks)
    _k().repack_q8_0x16(blocks.data_ptr(), blocks.shape[0], in_features, out.data_ptr())
    return out


def dequantize_rows(
    blocks: torch.Tensor, qtype: int, in_features: int, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows of W as float32: all of them, or ``rows`` [R] int64 (an embedding lookup)."""
    assert blocks.is_contiguous() and blocks.dtype == torch.uint8, "blocks must be contiguous uint8"
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= blocks.shape[0]):
            raise IndexError(f"row index out of range for a weight of {blocks.shape[0]} rows")
    count = blocks.shape[0] if rows is None else rows.numel()
    out = torch.empty(count, in_features, dtype=torch.float32)
    rows_ptr = 0 if rows is None else rows.data_ptr()
    _k().dequantize(qtype, blocks.data_ptr(), in_features, rows_ptr, count, out.data_ptr(), torch.get_num_threads())
    return out


class GGUFLinear(nn.Module):
    """``nn.Linear`` whose weight is GGUF blocks ``[out_features, row_bytes]`` uint8; ``bias``:
    a float32 bias parameter (filled by the checkpoint, as Qwen2's q/k/v biases). Q5_0, Q8_0,
    Q4_K and Q6_K blocks are repacked once here (``repack``) unless ``file_layout``:
    ``gguf_qtype`` is the file's type, ``qtype`` the layout the kernel runs."""

    blocks: torch.Tensor

    def __init__(
        self, blocks: torch.Tensor, qtype: int, in_features: int, bias: bool = False, file_layout: bool = False
    ) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(blocks.shape[0]), requires_grad=False) if bias else None
        expect = row_bytes(qtype, in_features)
        assert blocks.dim() == 2 and blocks.shape[1] == expect, f"blocks {tuple(blocks.shape)}, want [*, {expect}]"
        self.gguf_qtype = qtype
        blocks = blocks.contiguous()
        if not file_layout and qtype in REPACKED:
            blocks, qtype = repack(blocks, qtype, in_features)
        self.register_buffer("blocks", blocks, persistent=False)
        self.qtype = qtype
        self.in_features = in_features
        self.out_features = blocks.shape[0]
        self.int8_activations = False  # set_int8_activations()
        self._gemm_bf16 = False

    @property
    def gemm_bf16(self) -> bool:
        """Prefill-sized calls in bfloat16 (``gguf_matmul``), and decode steps of 7+ streams in
        ``cpu_ops.decoder_stack``."""
        return self._gemm_bf16

    @gemm_bf16.setter
    def gemm_bf16(self, on: bool) -> None:
        global generation
        self._gemm_bf16 = on
        generation += 1

    def set_int8_activations(self, on: bool = True) -> None:
        """Multiply with 8-bit activations (``q8_0_matmul_int8``); Q8_0 weights only. With 16k
        rows, the weight is regrouped by 16 rows on the way (``repack_q8_0x16``), which only
        the int8 matmul reads: once on, it stays on."""
        if on and self.qtype not in (QTYPES["Q8_0"], Q8_0X16):
            raise ValueError(f"8-bit activations need Q8_0 weights, this one is {self.extra_repr()}")
        if not on and self.qtype == Q8_0X16:
            raise ValueError("8-bit activations stay on once the weight is regrouped for them")
        if on and self.qtype == QTYPES["Q8_0"] and self.out_features % 16 == 0:
            self.blocks = repack_q8_0x16(self.blocks, self.in_features)
            self.qtype = Q8_0X16
        self.int8_activations = on
        global generation
        generation += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()
        if self.int8_activations:
            y = q8_0_matmul_int8(x2, self.blocks, self.in_features, self.qtype)
        else:
            y = gguf_matmul(x2, self.blocks, self.qtype, self.in_features, self.gemm_bf16)
        if self.bias is not None:
            y += self.bias
        return y.view(*lead, self.out_features)

    def argmax(self, x: torch.Tensor) -> torch.Tensor | None:
        """x: [B, in] -> ``self(x).argmax(-1)`` [B] int64 without the [B, out] output, where the
        kernel can (8-bit activations on the regrouped Q8_0, no bias); None where it cannot."""
        if not self.heap_kernel:
            return None
        return q8_0x16_argmax_int8(x.reshape(-1, self.in_features).float(), self.blocks, self.in_features)

    def topk(self, x: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """x: [B, in] -> each row's ``t`` largest outputs and their indices ([B, t] each, in no
        order) without the [B, out] output, where the kernel can; None where it cannot."""
        if not self.heap_kernel or not 0 < t <= self.out_features:
            return None
        return q8_0x16_topk_int8(x.reshape(-1, self.in_features).float(), self.blocks, self.in_features, t)

    @property
    def heap_kernel(self) -> bool:
        """Whether argmax/topk run in the kernel: 8-bit activations on the regrouped Q8_0, no bias."""
        return self.int8_activations and self.qtype == Q8_0X16 and self.bias is None

    def extra_repr(self) -> str:
        layout = {Q8_0X16: " (in groups of 16 rows)"}.get(self.qtype, " (repacked)")
        name = qtype_name(self.gguf_qtype) + (layout if self.qtype != self.gguf_qtype else "")
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={name}"


def qtype_name(qtype: int) -> str:
    """A GGML type id's name (``Q4_K``), or the id as text for one the kernel does not read."""
    return next((k for k, v in QTYPES.items() if v == qtype), str(qtype))


class GGUFEmbedding(nn.Module):
    """``nn.Embedding`` on GGUF blocks; ``logits`` is the tied LM head on the same blocks."""

    def __init__(self, blocks: torch.Tensor, qtype: int, dim: int) -> None:
        super().__init__()
        self.head = GGUFLinear(blocks, qtype, dim, file_layout=True)  # Q8_0 stays: the int8 head's form
        self.num_embeddings = blocks.shape[0]
        self.embedding_dim = dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [T] -> [T, dim] float32
        h = self.head
        return dequantize_rows(h.blocks, h.qtype, h.in_features, ids.reshape(-1)).view(*ids.shape, h.in_features)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, dim] -> [B, vocab]
        return self.head(x)
