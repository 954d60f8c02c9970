"""Pinned host staging: one host-to-device copy per dtype per step, into reusable buffers.

Building a step's inputs as many small tensors and copying each costs a pinned allocation
and a copy call apiece; on the GPU machine that host time dominated a small model's step.
Instead the step's host tensors are packed into one pinned buffer per dtype, copied with
one non-blocking call each, and sliced into views on the device.

Buffers are indexed by ``slot`` (step index modulo ``num_slots``). A slot's buffer is
rewritten only when step ``n + num_slots`` is launched, which happens after step ``n`` was
committed (the runner makes num_slots > pipeline depth), so its copy finished long before.
"""

from __future__ import annotations

import torch


class PinnedStaging:
    def __init__(self, num_slots: int, pin: bool) -> None:
        self.num_slots = num_slots
        self.pin = pin
        self._bufs: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}

    def clear(self) -> None:
        self._bufs.clear()

    def buffer(self, slot: int, dtype: torch.dtype, numel: int, name: str = "") -> torch.Tensor:
        """Pinned memory for ``numel`` values in ``slot``; one buffer per (dtype, name), so two
        tensors of one step in flight at once must use different names."""
        key = (slot % self.num_slots, dtype, name)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            size = max(numel, 2 * (0 if buf is None else buf.numel()), 1024)
            buf = torch.empty(size, dtype=dtype, pin_memory=self.pin)
            self._bufs[key] = buf
        return buf[:numel]

    def upload(self, slot: int, tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """Copy host ``tensors`` to ``device`` (on the current stream); returns device views."""
        groups: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
        for name, t in tensors.items():
            groups.setdefault(t.dtype, []).append((name, t))
        out: dict[str, torch.Tensor] = {}
        for dtype, items in groups.items():
            total = sum(t.numel() for _, t in items)
            host = self.buffer(slot, dtype, total)
            offset = 0
            spans = []
            for name, t in items:
                n = t.numel()
                host[offset : offset + n].copy_(t.reshape(-1))
                spans.append((name, offset, n, t.shape))
                offset += n
            dev = host.to(device, non_blocking=True)
            for name, off, n, shape in spans:
                out[name] = dev[off : off + n].view(shape)
        return out
