"""Token automata on the device: a constrained step launched whole, with no wait for a commit.

A step whose constrained rows are all in token automata (:mod:`aserve.sampling.fsm`) needs no
host work between its forward and its sampler. Each request's automaton state lives on the
device beside its next token (``FutureMap.states``, by row): the step reads its rows' states
there, gathers their masks from the automata's tables, draws, and leaves each row's next
state where the next step reads it, all in stream order, like the FutureMap's tokens. So such a
step is launched at once, like an unconstrained one (no split launch, no sampler waiting for
the commit before it), and a constrained decode keeps the look-ahead of a free one.

Where a row's state comes from is decided on the host at launch (:func:`plan_automata`):

* the host's own (``FsmState``), when no earlier step that draws the request's token is
  still uncommitted (``Req.lookahead`` is 1: this step's): its first token, or after a pause;
* the device's, when the last step that drew the request's token left its state in the
  request's current row (``FsmState.on_device``: that row and its generation).

A step with a row constrained by llguidance (admitted before its automaton was built, or
outside the automata's subset) is split or filled on the host as before; its automaton rows'
states are still moved on on the device after its draw (:meth:`AutomatonRows.track`), so the
steps after it find them there.

The host still advances each ``FsmState`` at the commit (stops, errors, the same state the
device reached). ``ASERVE_FSM_ON_DEVICE=0`` turns the path off (kept to measure against).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    from aserve.device.future_map import FutureMap
    from aserve.device.inputs import DeviceInputs, StepInputs
    from aserve.sampling.fsm import DeviceAutomaton, FsmState
    from aserve.sampling.sampler import SampleOutput
    from aserve.scheduler.plan import Plan


def automata_on_device() -> bool:
    """Whether steps whose constrained rows are all in token automata take the device path."""
    return os.environ.get("ASERVE_FSM_ON_DEVICE", "1") != "0"


class _Group(NamedTuple):
    tables: DeviceAutomaton
    offset: int  # where its rows start in ``AutomatonRows.packed``
    rows: int
    source: int  # where its rows' states are: 1 all on the host's (``start``), -1 all on the device, 0 some of each
    every: bool  # its rows are the step's batch rows 0, 1, ..., all of them (no gathers by batch row)

    def parts(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Its rows' places among the step's constrained rows, batch rows and states in
        ``packed`` (views)."""
        at, n = self.offset, self.rows
        return packed[at : at + n], packed[at + n : at + 2 * n], packed[at + 2 * n : at + 3 * n]


class AutomatonRows:
    """A step's constrained rows in token automata, grouped by automaton. ``packed`` (int64,
    host) holds, for each group in turn, its rows' places among the step's constrained rows,
    their batch rows, and their states (-1: the one on the device). ``whole``: every
    constrained row of the step is here, and its masks come from :meth:`masks`; otherwise
    the masks come from the host (a split or host-filled step) and :meth:`track` only moves
    these rows' states on, so that the next step finds them on the device."""

    def __init__(self, groups: list[_Group], packed: torch.Tensor, rows: int, whole: bool) -> None:
        self.groups, self.packed, self.rows, self.whole = groups, packed, rows, whole
        self._drawn: list[tuple[_Group, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _locate(self, packed: torch.Tensor, batch_rows: torch.Tensor, states: torch.Tensor) -> list[torch.Tensor]:
        """On the device (``packed``: this object's, there): each group's rows' states now;
        returns their places among the step's constrained rows."""
        self._drawn, places = [], []
        for g in self.groups:
            at, idx, start = g.parts(packed)
            rows = batch_rows if g.every else batch_rows.index_select(0, idx)
            if g.source == 1:
                now = start
            elif g.source == -1:
                now = states.index_select(0, rows)
            else:
                now = torch.where(start >= 0, start, states.index_select(0, rows))
            self._drawn.append((g, now, rows, idx))
            places.append(at)
        return places

    def masks(self, packed: torch.Tensor, batch_rows: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """On the device: the rows' masks ([rows, words], in the step's constrained-row order)
        from their states (the host's, or ``states``' at their FutureMap rows)."""
        assert self.whole, "the masks of a step whose every constrained row is here"
        places = self._locate(packed, batch_rows, states)
        parts = [g.tables.masks_of(now) for g, now, _, _ in self._drawn]
        if len(parts) == 1:
            return parts[0]  # one automaton: its rows are the step's, in order
        bits = torch.empty((self.rows, parts[0].shape[1]), dtype=torch.int32, device=states.device)
        for at, part in zip(places, parts, strict=True):
            bits.index_copy_(0, at, part)
        return bits

    def argmax_(
        self, out: torch.Tensor, logits: torch.Tensor, packed: torch.Tensor, batch_rows: torch.Tensor,
        states: torch.Tensor, publish: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:  # fmt: skip
        """On a CUDA device, a whole greedy step's draw in one launch a group
        (:func:`~aserve.kernels.bitmask.automaton_argmax_`): each row's state (the host's, or
        ``states``' at its FutureMap row), its mask from the automaton's table, the masked
        argmax into ``out`` (by batch row; published with ``publish``), and the next state
        back into ``states``. What :meth:`masks`, the masked argmax and :meth:`advance` do,
        with no mask written and no tensor of states."""
        from aserve.kernels.bitmask import automaton_argmax_

        assert self.whole, "the draw of a step whose every constrained row is here"
        for g in self.groups:
            _, idx, start = g.parts(packed)
            automaton_argmax_(out, logits, idx, g.tables, start, states, batch_rows, publish)
        return out

    def advance(self, tokens: torch.Tensor, states: torch.Tensor) -> None:
        """On the device, after :meth:`masks` and the draw (``tokens``: the step's, by batch
        row): each row's next state into ``states`` at its FutureMap row."""
        for g, now, rows, idx in self._drawn:
            drawn = tokens if g.every else tokens.index_select(0, idx)
            states.index_copy_(0, rows, g.tables.step(now, drawn))
        self._drawn = []

    def track(self, packed: torch.Tensor, batch_rows: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor) -> None:
        """On the device, after a draw whose masks came from the host: :meth:`advance`."""
        self._locate(packed, batch_rows, states)
        self.advance(tokens, states)

    def steady(self) -> AutomatonRows:
        """The same rows at the next step, when nothing else drew them in between: every
        state is then on the device (a decode block's next step with the same members)."""
        packed = self.packed.clone()
        for g in self.groups:
            g.parts(packed)[2].fill_(-1)
        return AutomatonRows([g._replace(source=-1) for g in self.groups], packed, self.rows, self.whole)

    def keep(self) -> list[Any]:
        """What the device reads until the step is done (the tables)."""
        return [g.tables for g in self.groups]


def warm_up(device: torch.device, logits: torch.Tensor | None = None) -> torch.Tensor:
    """The device path's operations once, on a two-state automaton: CUDA loads a kernel's
    module at its first launch, which the first constrained step would otherwise wait for
    (tens of ms on the H100 host). With ``logits`` (on CUDA: a row like a decode graph's, of
    the head's dtype and width) also the one-launch draw, which Triton compiles for them here
    rather than at the first constrained step. Returns the states it moved on (state 0,
    token 1 -> 1)."""
    from aserve.sampling.fsm import DeviceAutomaton

    def put(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    # State 0: token 1 leads to state 1, any other back to 0; state 1 leads nowhere else.
    tables = DeviceAutomaton(torch.full((2, 1), -1, dtype=torch.int32, device=device), put([0, 1]),
                             put([0, 1, 2, 4]), put([0, 0, 1, 0, 1]), 4, 1)  # fmt: skip
    states = put([0, 0])
    for source, every in ((0, False), (-1, True)):
        rows = AutomatonRows([_Group(tables, 0, 1, source, every)], put([0, 0, -1]), 1, True)
        rows.masks(rows.packed, put([0]), states)
        rows.advance(put([1]), states)
    if logits is not None:
        from aserve.sampling.masks import mask_words

        # Every token allowed: the draw is the plain argmax; states' row 1 takes the move.
        words = mask_words(logits.shape[1])
        wide = tables._replace(masks=torch.full((2, words), -1, dtype=torch.int32, device=device), stride=32 * words)
        rows = AutomatonRows([_Group(wide, 0, 1, -1, True)], put([0, 0, -1]), 1, True)
        tokens = put([0])
        rows.argmax_(tokens, logits[:1], rows.packed, put([1]), states, (tokens.clone(), put([0])))
        states[1] = 0
    return states


def plan_automata(plan: Plan, host: StepInputs, device: torch.device) -> AutomatonRows | None:
    """The step's constrained rows in token automata whose states the device holds or the
    host knows (see the module's docstring), or None if there are none. Marks each row's
    ``FsmState.on_device`` for the next step's launch: this step leaves the state there, or
    (None: a row whose state is neither) it does not. Per row of every constrained step, so
    plain: a few attribute reads and appends."""
    grammar = host.grammar_rows
    reqs = plan.reqs()
    groups: dict[int, tuple[Any, list[int], list[int], list[int]]] = {}
    fsm_of_last, last = None, None
    whole = True
    for k, (i, g) in enumerate(grammar):
        fsm = g.fsm
        if fsm is None:
            whole = False
            continue
        st, req = cast("FsmState", g), reqs[i]
        at = (req.row, req.generation)
        if req.lookahead == 1:  # only this step draws its token: the host's state is current
            start = fsm.number_of(st)
        elif st.on_device == at:
            start = -1
        else:
            st.on_device = None
            whole = False
            continue
        st.on_device = at
        if fsm is not fsm_of_last:
            fsm_of_last = fsm
            last = groups.get(id(fsm))
            if last is None:
                last = groups[id(fsm)] = (fsm, [], [], [])
        assert last is not None
        last[1].append(k)
        last[2].append(i)
        last[3].append(start)
    if not groups:
        return None
    packed: list[int] = []
    made = []
    batch = len(reqs)
    for fsm, at_, idx, start in groups.values():
        lo, hi = min(start), max(start)
        source = -1 if hi < 0 else 1 if lo >= 0 else 0
        every = len(idx) == batch  # (ascending, so 0, 1, ..., batch - 1)
        made.append(_Group(fsm.on_device(device), len(packed), len(at_), source, every))
        packed += at_ + idx + start
    return AutomatonRows(made, torch.tensor(packed, dtype=torch.int64), len(grammar), whole)


class DevicePath:
    """A runner's token automata on the device: which of a step's rows draw there
    (:meth:`rows`, at launch) and the draw (:meth:`draw`, where the step's sampler runs)."""

    def __init__(self, device: torch.device, future_map: FutureMap) -> None:
        self.device, self.future_map = device, future_map
        self.on = automata_on_device()
        # A greedy whole step's draw in one launch (AutomatonRows.argmax_), on CUDA.
        # ASERVE_FSM_ONE_LAUNCH=0 keeps masks, masked argmax and lookup apart (to measure);
        # =1 takes it on a CPU too (Triton's interpreter: the tests).
        one = os.environ.get("ASERVE_FSM_ONE_LAUNCH", "")
        self.one_launch = one == "1" or (one != "0" and device.type == "cuda")
        self.steps = 0  # steps launched whole, their rows' automaton states on the device
        self.one_launch_steps = 0  # of which drawn in one launch (AutomatonRows.argmax_)
        self.steady_steps = 0  # of which a decode block's with the members of the step before
        self._steady: tuple[list[Any], AutomatonRows] | None = None

    def rows(self, plan: Plan, host: StepInputs) -> AutomatonRows | None:
        """:func:`plan_automata`, or on a step of a decode block alone whose constrained
        members are those of the step launched just before (a block's lists are new when its
        members change) and were drawn whole there, the same rows with every state on the
        device: no pass over the rows on the host. Called at every launch, in order (a step
        that skips it would draw rows this reuse takes to be on the device)."""
        if not (self.on and host.grammar_states):
            self._steady = None
            return None
        steady, block = self._steady, plan.block
        # The block's members (a new list whenever one joins or leaves), not only its
        # constrained ones: every row of a reused step is the batch's own (``_Group.every``).
        members = None if block is None or plan.extra else block.reqs
        auto: AutomatonRows | None
        if steady is not None and members is steady[0]:
            auto = steady[1].steady()
            self.steady_steps += 1
        else:
            auto = plan_automata(plan, host, self.device)
        self._steady = (members, auto) if members is not None and auto is not None and auto.whole else None
        return auto

    def draw(
        self, dev: DeviceInputs, sample: Callable[[DeviceInputs], SampleOutput], auto: AutomatonRows | None,
        packed: torch.Tensor | None,
    ) -> SampleOutput:  # fmt: skip
        """``sample(dev)``, the step's draw, with its rows in token automata (``packed``:
        ``auto``'s, on the device): a whole step's masks come from their states on the device,
        and the draw moves every such row's state on."""
        if auto is None or packed is None:
            return sample(dev)
        states = self.future_map.states
        if not auto.whole:
            out = sample(dev)
            auto.track(packed, dev.rows, states, out.token_ids)
            return out
        self.steps += 1
        if self.one_launch and dev.sbatch is None and dev.mask_rows is not None:
            # A greedy step: its masked argmax (StepForward's) takes the rows' automata.
            self.one_launch_steps += 1
            return sample(dev.with_automata(auto, packed))
        out = sample(dev.with_masks(auto.masks(packed, dev.rows, states)))
        auto.advance(out.token_ids, states)
        return out
