"""KV memory on the device: the per-layer cache tensors and the request-to-token table,
indexed by the host bookkeeping of :class:`aserve.kv.allocator.KVAllocator`."""

from __future__ import annotations

import torch

from aserve.kv.allocator import KVAllocator, LedgerView, PageAllocator, ReqRowPool
from aserve.models.config import ModelConfig

__all__ = ["KVAllocator", "KVPool", "LedgerView", "PageAllocator", "ReqRowPool", "bytes_per_token"]


class KVPool(KVAllocator):
    """The KV allocator plus the tensors it indexes: per-layer K/V caches and the table.

    The request-to-token table lives on the device only and is written inside each step (on
    the device's stream), so the host can plan step n+1 while step n still reads the table.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        num_rows: int,
        max_context: int,
        dtype: torch.dtype,
        device: torch.device,
        layout: str = "token",
    ) -> None:
        super().__init__(num_pages, page_size, num_rows, max_context)
        num_slots = num_pages * page_size
        if layout not in ("token", "head"):
            raise ValueError(f"KV layout {layout!r}: 'token' or 'head'")
        self.layout = layout
        # One extra slot at the end: padded (unused) token positions may point there.
        self.kv_cache: list[tuple[torch.Tensor, torch.Tensor]] = [
            (
                kv_tensor(num_slots + 1, config, dtype, device, layout),
                kv_tensor(num_slots + 1, config, dtype, device, layout),
            )
            for _ in range(config.num_layers)
        ]
        # One spare row at the end that no request gets: padded decode-graph rows use it.
        self.table_device = torch.zeros(num_rows + 1, max_context, dtype=torch.int64, device=device)
        self.pad_row = num_rows
        self.pad_slot = num_slots
        self._bytes_per_token = bytes_per_token(config, dtype)

    def bytes_per_token(self) -> int:
        return self._bytes_per_token

    def release_device(self) -> None:
        """The engine closed: drop the KV cache and the request table (the ledger stays readable)."""
        self.kv_cache = []
        self.table_device = self.table_device.new_empty(0, 0)


def kv_tensor(slots: int, config: ModelConfig, dtype: torch.dtype, device: torch.device, layout: str) -> torch.Tensor:
    """One layer's K (or V) cache, [slots, KV heads, head_dim], zeroed. ``token``: contiguous,
    a token's heads side by side; ``head``: the same shape over [KV heads, slots, head_dim]
    memory (``transpose``), so one head's keys for consecutive slots are consecutive bytes —
    a decode program, which reads one head of one sequence, streams runs of a page's length
    instead of a head_dim-sized piece of every token. The kernels index through strides."""
    hkv, d = config.num_kv_heads, config.head_dim
    if layout == "head":
        return torch.zeros(hkv, slots, d, dtype=dtype, device=device).transpose(0, 1)
    return torch.zeros(slots, hkv, d, dtype=dtype, device=device)


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
