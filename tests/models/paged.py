"""Test helper: drive a model through the paged KV cache like the engine would."""

from __future__ import annotations

import random

import torch
from torch import nn

from aserve.attention.metadata import build_metadata
from aserve.models.config import ModelConfig


class PagedRunner:
    """Owns a slot table and KV cache; slots are handed out in shuffled order so every
    sequence's KV ends up non-contiguous."""

    def __init__(
        self,
        model: nn.Module,
        cfg: ModelConfig,
        dtype: torch.dtype,
        rows: int = 4,
        max_ctx: int = 64,
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.device = device or torch.device("cpu")
        num_slots = rows * max_ctx + 7
        self.free = list(range(1, num_slots))  # slot 0 is never used, like a padding slot
        random.Random(0).shuffle(self.free)
        self.req_to_token = torch.zeros(rows, max_ctx, dtype=torch.int64)
        self.lens = [0] * rows
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(cfg.num_layers)
        ]

    @torch.no_grad()
    def step(self, batch: list[tuple[int, list[int]]]) -> torch.Tensor:
        """batch: (row, new token ids) per sequence -> logits [B, vocab]."""
        rows, prefix, extend, ids = [], [], [], []
        for row, new in batch:
            start = self.lens[row]
            for j in range(len(new)):
                self.req_to_token[row, start + j] = self.free.pop()
            rows.append(row)
            prefix.append(start)
            extend.append(len(new))
            ids.extend(new)
            self.lens[row] += len(new)
        table = self.req_to_token.to(self.device)
        meta = build_metadata(table, rows, prefix, extend, self.device)
        ids_t = torch.tensor(ids, dtype=torch.int64, device=self.device)
        out: torch.Tensor = self.model(ids_t, meta, self.kv)
        return out.cpu()
