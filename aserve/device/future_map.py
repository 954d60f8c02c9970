"""The FutureMap: next-token mailboxes on the device, one per request row.

Step n scatters each request's sampled token into ``buf[row]``; step n+1 gathers its decode
inputs from the same rows when it starts on the device. The dependency never leaves the
device, so the host can plan n+1 before n's token is known to it.

Debug mode (on in tests) starts the buffer at -1, asserts every gathered value is
non-negative and re-poisons what it consumed, so a missing publish or a double consume is
an error, not a silently wrong token. It also stores the row's generation beside the
token and checks it on gather, which catches a reader of a reused row (ABA).
"""

from __future__ import annotations

import torch

POISON = -1


class FutureMap:
    def __init__(self, num_rows: int, device: torch.device, debug: bool) -> None:
        self.debug = debug
        fill = POISON if debug else 0
        self.tokens = torch.full((num_rows,), fill, dtype=torch.int64, device=device)
        self.generations = torch.zeros(num_rows, dtype=torch.int64, device=device)
        # Each row's token-automaton state, where the step that drew its token left it
        # (aserve.device.automata): the next step's masks are read from it on the device.
        self.states = torch.zeros(num_rows, dtype=torch.int64, device=device)

    def release(self) -> None:
        """The engine closed: drop the device tensors."""
        self.tokens = self.tokens.new_empty(0)
        self.generations = self.generations.new_empty(0)
        self.states = self.states.new_empty(0)

    def publish(self, rows: torch.Tensor, tokens: torch.Tensor, generations: torch.Tensor) -> None:
        # rows, tokens, generations: [N] on the device
        self.tokens[rows] = tokens
        if self.debug:
            self.generations[rows] = generations

    def check(self, rows: torch.Tensor, generations: torch.Tensor) -> None:
        """Debug: the rows hold published tokens of these generations (no poisoning).

        Decode graphs gather and publish inside the graph; this runs before the replay."""
        if self.debug and rows.numel() > 0:
            ok = (self.tokens[rows] >= 0).all() & (self.generations[rows] == generations).all()
            torch._assert_async(ok, "FutureMap gather read an unpublished or reused row")

    def gather(self, rows: torch.Tensor, generations: torch.Tensor) -> torch.Tensor:
        # rows, generations: [N] -> tokens [N]
        out = self.tokens[rows]
        if self.debug and rows.numel() > 0:
            ok = (out >= 0).all() & (self.generations[rows] == generations).all()
            # _assert_async checks on the device without a host sync on CUDA.
            torch._assert_async(ok, "FutureMap gather read an unpublished or reused row")
            self.tokens[rows] = POISON
        return out
