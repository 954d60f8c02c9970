"""Token automata on the device: a constrained step launched whole, with no wait for a commit.

A step whose constrained rows are all in token automata (:mod:`aserve.sampling.fsm`) needs no
host work between its forward and its sampler. Each request's automaton state lives on the
device beside its next token (``FutureMap.states``, by row): the step reads its rows' states
there, gathers their masks from the automata's tables, draws, and leaves each row's next
state where the next step reads it, all in stream order, like the FutureMap's tokens. So such a
step is launched at once, like an unconstrained one (no split launch, no sampler waiting for
the commit before it), and a constrained decode keeps the look-ahead of a free one.

Where a row's state comes from is decided on the host at launch (:func:`plan_automata`):

* the host's own (``FsmState``), when no earlier step that holds the request is still
  uncommitted (``Req.inflight`` is 1: this step): its first drawn token, or after a pause;
* the device's, when the last step that drew the request's token ran this path and left its
  state in the request's current row (``FsmState.on_device``, its row and generation);
* neither: the step takes the split launch as before (a row still constrained by llguidance,
  or a request whose last drawn token came from a split or host-filled step).

The host still advances each ``FsmState`` at the commit (stops, errors, the same state the
device reached). ``ASERVE_FSM_ON_DEVICE=0`` turns the path off (kept to measure against).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch

if TYPE_CHECKING:
    from aserve.device.inputs import StepInputs
    from aserve.sampling.fsm import DeviceAutomaton, FsmState
    from aserve.scheduler.policy import Plan


def automata_on_device() -> bool:
    """Whether steps whose constrained rows are all in token automata take the device path."""
    return os.environ.get("ASERVE_FSM_ON_DEVICE", "1") != "0"


class _Group(NamedTuple):
    tables: DeviceAutomaton
    offset: int  # where its rows start in ``AutomatonRows.packed``
    rows: int


class AutomatonRows:
    """A step's constrained rows, grouped by automaton. ``packed`` (int64, host) holds, for
    each group in turn, its rows' places among the step's constrained rows, their batch rows,
    and their states (-1: the one on the device)."""

    def __init__(self, groups: list[_Group], packed: torch.Tensor, rows: int) -> None:
        self.groups, self.packed, self.rows = groups, packed, rows
        self._drawn: list[tuple[DeviceAutomaton, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def masks(self, packed: torch.Tensor, batch_rows: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """On the device (``packed``: this object's, there): the rows' states (the host's, or
        ``states``' at their FutureMap rows) and their masks ([rows, words], in the step's
        constrained-row order)."""
        self._drawn = []
        parts = []
        for g in self.groups:
            at, idx, start = (packed[g.offset + k * g.rows : g.offset + (k + 1) * g.rows] for k in range(3))
            rows = batch_rows.index_select(0, idx)
            now = torch.where(start >= 0, start, states.index_select(0, rows))
            self._drawn.append((g.tables, now, rows, idx))
            parts.append((at, g.tables.masks_of(now)))
        if len(parts) == 1:
            return parts[0][1]  # one automaton: its rows are the step's, in order
        bits = torch.empty((self.rows, parts[0][1].shape[1]), dtype=torch.int32, device=states.device)
        for at, part in parts:
            bits.index_copy_(0, at, part)
        return bits

    def advance(self, tokens: torch.Tensor, states: torch.Tensor) -> None:
        """On the device, after the draw (``tokens``: the step's, by batch row): each row's next
        state into ``states`` at its FutureMap row."""
        for tables, now, rows, idx in self._drawn:
            states.index_copy_(0, rows, tables.step(now, tokens.index_select(0, idx)))
        self._drawn = []

    def keep(self) -> list[Any]:
        """What the device reads until the step is done (the tables)."""
        return [g.tables for g in self.groups]


def plan_automata(plan: Plan, host: StepInputs, device: torch.device) -> AutomatonRows | None:
    """The step's constrained rows for the device path, or None where it cannot take it (see
    the module's docstring). Marks each row's ``FsmState.on_device`` for the next step's
    launch: this step leaves the state on the device, or (None) it does not."""
    grammar = host.grammar_rows
    reqs = plan.reqs()
    groups: dict[int, tuple[Any, list[int], list[int], list[int]]] = {}
    for k, (i, g) in enumerate(grammar):
        fsm = g.fsm
        if fsm is None:
            break
        st, req = cast("FsmState", g), reqs[i]
        if req.inflight == 1:
            start = fsm.dense_of(st)
        elif st.on_device == (req.row, req.generation):
            start = -1
        else:
            break
        group = groups.get(id(fsm))
        if group is None:
            group = groups[id(fsm)] = (fsm, [], [], [])
        group[1].append(k)
        group[2].append(i)
        group[3].append(start)
    else:
        packed: list[int] = []
        made = []
        for fsm, at, idx, start in groups.values():
            made.append(_Group(fsm.on_device(device), len(packed), len(at)))
            packed += at + idx + start
        for i, g in grammar:
            req = reqs[i]
            cast("FsmState", g).on_device = (req.row, req.generation)
        return AutomatonRows(made, torch.tensor(packed, dtype=torch.int64), len(grammar))
    for _, g in grammar:
        if g.fsm is not None:
            cast("FsmState", g).on_device = None
    return None
