"""A step's inputs: built on the host from a plan, packed into one int64 tensor (one upload),
and read on the device as typed views.

Two shapes of step:

* the greedy graph fast path (every sequence decodes plain-greedily and the batch fits a
  captured graph): only the graph's input, the rows and their generations; no sampling
  (a prefill graph's step whose every row is plain greedy skips the sampling inputs too);
* the general path: every field of :class:`StepFields` and a sampling batch; ``graph_in`` too
  when every sequence decodes (a captured graph runs the forward, the sampler runs after it),
  or ``xgraph_in`` when a prompt chunk is in the step and a prefill graph fits it (its padded
  input holds the token and sequence fields, whose views are slices of it).
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.extend_graphs import ExtendGraphs
from aserve.sampling.masks import GrammarState, fill_masks
from aserve.sampling.sampler import SamplingBatch, make_sampling_batch
from aserve.sampling_params import SamplingParams
from aserve.scheduler.decode_batch import DecodeBlock
from aserve.scheduler.plan import Plan

if TYPE_CHECKING:
    from aserve.device.automata import AutomatonRows

_NO_OUTPUTS: list[int] = []  # stands for the output of a request without penalties (never read)
_NO_BAN: frozenset[int] = frozenset()


class StepFields(NamedTuple):
    """The general path's int64 inputs: lists on the host, ``[N]`` views on the device."""

    prefix: torch.Tensor  # [B] tokens already in the KV cache per sequence
    extend: torch.Tensor  # [B] new tokens per sequence
    slots: torch.Tensor  # [T] KV slot of each new token
    # [K] request-to-token table writes besides the new tokens' (whose rows, columns and slots
    # are the sequences' rows, ``positions`` and ``slots``): a cache hit's prefix slots.
    table_rows: torch.Tensor
    table_cols: torch.Tensor
    table_slots: torch.Tensor
    input_ids: torch.Tensor  # [T] prefill tokens; decode positions are filled from the FutureMap
    positions: torch.Tensor  # [T]
    logits_idx: torch.Tensor  # [B] last token of each sequence
    decode_token_idx: torch.Tensor  # [D] where each decode's input goes in input_ids
    decode_rows: torch.Tensor  # [D] FutureMap rows (and generations) the decodes read
    decode_gens: torch.Tensor
    sample_idx: torch.Tensor  # [S] sequences whose sampled token is an output
    pending_b: torch.Tensor  # [P] penalised decodes whose last output is still on the device:
    pending_c: torch.Tensor  #     (batch row, column in output_tokens, index among decodes)
    pending_decode: torch.Tensor
    plp_idx: torch.Tensor  # [E] prompt positions (index into T) whose logits give prompt logprobs
    plp_target: torch.Tensor  # [E] the prompt token that follows each


class SamplingInputs(NamedTuple):
    """Per-sequence sampling knobs on the host (one ``make_sampling_batch`` call)."""

    params: list[SamplingParams]
    seeds: list[int]
    steps: list[int]
    prompts: list[list[int]]
    outputs: list[list[int]]
    banned: list[frozenset[int]]
    grammar: list[tuple[int, GrammarState]]  # (batch row, state) of structured requests that sample

    def batch(self, device: torch.device | str, masks: bool = True) -> SamplingBatch:
        """The sampling batch; ``masks=False``: the grammar rows without their masks (a split
        launch fills them later, ``mask_bits`` None until then)."""
        grammar_masks = None
        if self.grammar:
            # Host work while the device runs the previous step: each row's allowed tokens.
            bits = fill_masks([g for _, g in self.grammar]) if masks else None
            grammar_masks = ([i for i, _ in self.grammar], bits)
        return make_sampling_batch(self.params, self.seeds, self.steps, self.prompts, self.outputs, device,
                                   self.banned, grammar_masks)  # fmt: skip


@dataclass
class StepInputs:
    """A step's inputs on the host: every int64 field packed in ``packed`` (``spans`` names
    them), plus the host-side lengths the attention backend reads and the sampling knobs."""

    packed: torch.Tensor
    spans: dict[str, tuple[int, int]]
    prefix_cpu: list[int]
    extend_cpu: list[int]
    sampling: SamplingInputs | None  # None: a greedy graph step (decode, or prefill graph), argmax only
    # Prompt logprobs: alternatives per row, and (entry, first prompt position, rows) per
    # sequence in launch order; the committer reads the rows back in this order.
    plp_top: int = 0
    plp_spans: list[tuple[int, int, int]] = field(default_factory=list)
    # A greedy decode graph step with constrained rows: their matchers, in ``mask_rows`` order
    # (their masks are applied to the graph's logits before an argmax; no sampler inputs).
    grammar: list[GrammarState] = field(default_factory=list)
    mask_rows: list[int] = field(default_factory=list)
    build_s: float = 0.0  # host seconds building them (ModelRunner.prepare)

    @property
    def grammar_states(self) -> list[GrammarState]:
        """The matchers whose masks this step needs (either path)."""
        if self.sampling is not None:
            return [g for _, g in self.sampling.grammar]
        return self.grammar

    @property
    def grammar_rows(self) -> list[tuple[int, GrammarState]]:
        """(entry, matcher) of the step's constrained rows (either path): what its commit advances."""
        if self.sampling is not None:
            return self.sampling.grammar
        return list(zip(self.mask_rows, self.grammar, strict=True))


@dataclass
class DeviceInputs:
    """A step's inputs where the forward runs."""

    rows: torch.Tensor  # [B] request rows (FutureMap / table rows)
    gens: torch.Tensor  # [B] their generations (ABA guard)
    graph_in: torch.Tensor | None  # [3, Bp] a captured decode graph's input
    xgraph_in: torch.Tensor | None  # [3 * Tp + 4 * Bp] a captured prefill graph's input
    fields: StepFields | None  # None on the greedy graph fast path
    sbatch: SamplingBatch | None  # None on the greedy graph fast path
    prefix_cpu: list[int]
    extend_cpu: list[int]
    plp_top: int = 0
    mask_rows: torch.Tensor | None = None  # [R] constrained rows of a greedy graph step
    mask_bits: torch.Tensor | None = None  # [R, words] their masks, once filled
    # Or, every constrained row in a token automaton whose draw takes its own masks
    # (AutomatonRows.argmax_): those rows and their packed table on the device.
    automata: tuple[AutomatonRows, torch.Tensor] | None = None

    def with_masks(self, bits: torch.Tensor) -> DeviceInputs:
        """These inputs with the constrained rows' masks (a split step's, filled after launch)."""
        if self.sbatch is None:
            return dataclasses.replace(self, mask_bits=bits)
        return dataclasses.replace(self, sbatch=dataclasses.replace(self.sbatch, mask_bits=bits))

    def with_automata(self, auto: AutomatonRows, packed: torch.Tensor) -> DeviceInputs:
        """These inputs with every constrained row's masks left to its automaton (a greedy
        step's draw in one launch: :meth:`AutomatonRows.argmax_`)."""
        return dataclasses.replace(self, automata=(auto, packed))

    @classmethod
    def from_packed(cls, packed: torch.Tensor, host: StepInputs, sbatch: SamplingBatch | None) -> DeviceInputs:
        views = unpack_int64(packed, host.spans)
        has_fields = "prefix" in views
        return cls(
            rows=views["rows"],
            gens=views["gens"],
            graph_in=views.get("graph_in"),
            xgraph_in=views.get("xgraph_in"),
            fields=StepFields(*(views[name] for name in StepFields._fields)) if has_fields else None,
            sbatch=sbatch,
            prefix_cpu=host.prefix_cpu,
            extend_cpu=host.extend_cpu,
            plp_top=host.plp_top,
            mask_rows=views.get("mask_rows"),
        )


def build_inputs(plan: Plan, graphs: DecodeGraphs | None, xgraphs: ExtendGraphs | None = None) -> StepInputs:
    """The host side of a launch: a plan's sequences as the device's inputs."""
    fast = _graph_fast_inputs(plan, graphs)
    if fast is not None:
        return fast
    block = plan.block
    # The block's decodes lead, straight from its columns (copies: the lists below grow);
    # then every other sequence one by one.
    rows: list[int] = []
    gens: list[int] = []
    prefix: list[int] = []
    slots: list[int] = []
    if block is not None:
        rows, gens, prefix, slots = list(block.rows), list(block.gens), list(block.positions), list(block.slots)
    n = len(prefix)
    extend = [1] * n
    table_rows: list[int] = []
    table_cols: list[int] = []
    table_slots: list[int] = []
    input_ids = [0] * n
    decode_token_idx = list(range(n))
    decode_rows = list(rows)
    decode_gens = list(gens)
    sample_idx = list(range(n))
    positions = list(prefix)
    plp_idx: list[int] = []
    plp_target: list[int] = []
    plp_spans: list[tuple[int, int, int]] = []
    plp_top = 0
    for i, s in enumerate(plan.extra, start=n):
        row, pos = s.row, s.prefix_len
        rows.append(row)
        gens.append(s.generation)
        prefix.append(pos)
        extend.append(s.extend_len)
        if s.input_ids is None:
            # A decode (most sequences of a mixed step): one token at ``pos``, never cached-prefix
            # slots (those come with an admission's first chunk); plain appends, no temporaries.
            slot = s.slots[0]
            slots.append(slot)
            positions.append(pos)
            decode_token_idx.append(len(input_ids))
            decode_rows.append(row)
            decode_gens.append(s.generation)
            input_ids.append(0)
        else:
            slots.extend(s.slots)
            positions.extend(range(pos, pos + s.extend_len))
            if s.prefix_slots:  # the first step after a cache hit: the cached prefix's slots
                table_rows.extend([row] * len(s.prefix_slots))
                table_cols.extend(range(len(s.prefix_slots)))
                table_slots.extend(s.prefix_slots)
            if s.req.wants_prompt_logprobs:
                # Position j's logits give prompt token j + 1's logprob: every position of the
                # chunk but the prompt's last (whose logits sample the first output).
                prompt = s.req.prompt_ids
                first = max(pos, len(s.req.prompt_logprobs) - 1)
                last = min(pos + s.extend_len, len(prompt) - 1)
                if last > first:
                    plp_spans.append((i, first + 1, last - first))
                    plp_idx.extend(range(len(input_ids) + first - pos, len(input_ids) + last - pos))
                    plp_target.extend(prompt[first + 1 : last + 1])
                    plp_top = max(plp_top, s.req.params.prompt_logprobs or 0)
            input_ids.extend(s.input_ids)
        if s.samples:
            sample_idx.append(i)
    logits_idx: list[int] = []
    acc = 0
    for e in extend:
        acc += e
        logits_idx.append(acc - 1)
    packed: dict[str, list[int]] = {"rows": rows, "gens": gens}
    fields = {"input_ids": input_ids, "positions": positions, "slots": slots, "prefix": prefix, "extend": extend,
              "logits_idx": logits_idx}  # fmt: skip
    inner: dict[str, tuple[int, int]] = {}  # fields that lie inside a prefill graph's input
    if graphs is not None and len(decode_rows) == len(rows):
        # Every sequence decodes (its input comes from the FutureMap): a captured graph's
        # step, if the batch fits the ladder. [3 * Bp], row-major [3, Bp].
        graph_in = graphs.host_inputs(rows, prefix, slots)
        if graph_in is not None:
            packed["graph_in"] = graph_in
    elif xgraphs is not None and not plp_idx:
        padded = xgraphs.host_inputs(input_ids, positions, slots, rows, prefix, extend, logits_idx)
        if padded is not None:
            packed["xgraph_in"], inner = padded
            fields = {}
    sampling: SamplingInputs | None = None
    pending: list[tuple[int, int, int]] = []
    if not (inner and _all_plain_greedy(plan)):  # a greedy prefill graph step needs no sampler
        sampling, pending = _sampling_inputs(plan)
    packed.update(fields)
    packed.update(
        table_rows=table_rows, table_cols=table_cols, table_slots=table_slots,
        decode_token_idx=decode_token_idx, decode_rows=decode_rows, decode_gens=decode_gens, sample_idx=sample_idx,
        pending_b=[b for b, _, _ in pending], pending_c=[c for _, c, _ in pending],
        pending_decode=[d for _, _, d in pending], plp_idx=plp_idx, plp_target=plp_target,
    )  # fmt: skip
    flat, spans = pack_int64(packed)
    if inner:
        base = spans["xgraph_in"][0]
        spans.update({name: (base + off, n) for name, (off, n) in inner.items()})
    return StepInputs(flat, spans, prefix, extend, sampling, plp_top, plp_spans)


def _all_plain_greedy(plan: Plan) -> bool:
    """Every token the step samples is the plain argmax (no penalty, bias, logprobs, grammar,
    or stop ids banned under min_tokens); a prompt's non-final chunk samples nothing. (A
    block's members have no min_tokens.)"""
    block = plan.block
    return (block is None or (block.greedy and not block.grammar_idx)) and all(
        not s.samples or (s.req.params.is_plain_greedy and s.output_index >= s.req.params.min_tokens)
        for s in plan.extra
    )


def _sampling_inputs(plan: Plan) -> tuple[SamplingInputs, list[tuple[int, int, int]]]:
    """The sampler's per-sequence knobs, and the penalised decodes whose last output is still
    on the device: (batch row, column in output_tokens, index among decodes), filled there."""
    sampling = SamplingInputs([], [], [], [], [], [], [])
    pending: list[tuple[int, int, int]] = []
    decode = -1
    if (block := plan.block) is not None:  # no penalty or min_tokens among them
        reqs = block.reqs
        n = len(reqs)
        sampling.grammar.extend(zip(block.grammar_idx, block.grammars, strict=True))  # the block leads: row = index
        sampling.params.extend(r.params for r in reqs)
        sampling.seeds.extend(r.seed for r in reqs)
        sampling.steps.extend(block.output_index)
        sampling.prompts.extend(r.prompt_ids for r in reqs)
        sampling.outputs.extend([_NO_OUTPUTS] * n)
        sampling.banned.extend([_NO_BAN] * n)
        decode += n
    for i, s in enumerate(plan.extra, start=len(sampling.params)):
        req = s.req
        decode += s.input_ids is None
        if s.samples and req.grammar is not None:
            sampling.grammar.append((i, req.grammar))
        sampling.params.append(req.params)
        sampling.seeds.append(req.seed)
        sampling.steps.append(s.output_index)
        sampling.prompts.append(req.prompt_ids)
        # Under min_tokens, this step's token may not be a stop id (EOS included).
        sampling.banned.append(req.stop_ids if s.output_index < req.params.min_tokens else _NO_BAN)
        if req.params.has_penalty:
            # Only penalties read the output so far: copying it for every request on
            # every step would cost O(tokens generated) per step.
            out = list(req.output_ids)
            if s.pending_output:
                # Uncommitted: the pending output and this step's. Inputs built after a commit
                # that took the pending one would count it twice.
                assert len(out) + 2 == req.num_launched_outputs, f"{req.rid}: pending output already committed"
                pending.append((i, len(out), decode))
                out.append(0)  # placeholder, replaced by the FutureMap value on the device
            sampling.outputs.append(out)
        else:
            sampling.outputs.append(_NO_OUTPUTS)
    return sampling, pending


def _graph_fast_inputs(plan: Plan, graphs: DecodeGraphs | None) -> StepInputs | None:
    """The common steady-state step: every sequence decodes greedily (no penalty, no
    logprobs) and the batch fits a captured graph. Only the graph's input, rows and
    generations are built and uploaded, and no sampling tensors at all: the graph's
    argmax is the step's output, or for rows a grammar constrains, the argmax of their
    masked logits (``mask_rows``). None when the step needs the general path."""
    if graphs is None:
        return None
    block = plan.block
    if block is not None:
        if not plan.extra:  # its constrained members' masks are applied to the graph's logits
            return _block_graph_inputs(block, graphs) if block.greedy else None
        if not block.greedy or any(s.input_ids is not None for s in plan.extra):
            return None  # a prompt chunk in the step: not a decode graph's (and no SeqPlans built)
    mask_rows: list[int] = []
    grammar: list[GrammarState] = []
    for i, s in enumerate(plan.seqs):  # one pass: every sequence decodes (and so samples) greedily
        params = s.req.params
        if s.input_ids is not None or s.prefix_slots or not params.is_greedy_argmax:
            return None
        if s.output_index < params.min_tokens:
            return None  # stop ids are banned this step: the sampler must run
        if (g := s.req.grammar) is not None:
            mask_rows.append(i)
            grammar.append(g)
    rows = [s.row for s in plan.seqs]
    positions = [s.prefix_len for s in plan.seqs]
    graph_in = graphs.host_inputs(rows, positions, [s.slots[0] for s in plan.seqs])
    if graph_in is None:
        return None
    fields = {"rows": rows, "gens": [s.generation for s in plan.seqs], "graph_in": graph_in}
    if mask_rows:
        fields["mask_rows"] = mask_rows
    flat, spans = pack_int64(fields)
    return StepInputs(flat, spans, positions, [1] * len(rows), None, grammar=grammar, mask_rows=mask_rows)


def _block_graph_inputs(block: DecodeBlock, graphs: DecodeGraphs) -> StepInputs | None:
    """The fast path from a block's columns (no per-sequence loop)."""
    graph_in = graphs.host_inputs(block.rows, block.positions, block.slots)
    if graph_in is None:
        return None
    fields = {"rows": block.rows, "gens": block.gens, "graph_in": graph_in}
    if block.grammar_idx:  # constrained members: their masks go on the graph's logits
        fields["mask_rows"] = block.grammar_idx
    flat, spans = pack_int64(fields)
    return StepInputs(flat, spans, block.positions, [1] * len(block), None, grammar=block.grammars,
                      mask_rows=block.grammar_idx)  # fmt: skip


def pack_int64(fields: dict[str, list[int]]) -> tuple[torch.Tensor, dict[str, tuple[int, int]]]:
    """Every int64 input of a step in one host tensor (one ``torch.tensor`` call, one H2D
    copy); ``unpack_int64`` turns it back into views by name.

    Each field starts on a 16-byte boundary (odd-length fields get one int64 of padding).
    Triton specialises a kernel on whether each pointer argument is 16-byte aligned, so
    without this a field's alignment would follow the parity of the batch size, and the
    first prefill of the other parity compiled new attention kernels in the middle of
    serving (H200: a 1.3 s launch; warm-up had covered only one parity)."""
    flat: list[int] = []
    spans: dict[str, tuple[int, int]] = {}
    for name, values in fields.items():
        spans[name] = (len(flat), len(values))
        flat += values
        if len(values) % 2:
            flat.append(0)
    if not flat:
        return torch.empty(0, dtype=torch.int64), spans
    # One struct.pack_into over the concatenated lists converts the ints in C at ~12 ns each,
    # against ~54 for array('q').extend of each list and ~90 for torch.tensor(list): a mixed
    # step of W1 packs ~10k ints. The tensor shares (and keeps alive) the buffer.
    buf = bytearray(8 * len(flat))
    struct.pack_into(f"{len(flat)}q", buf, 0, *flat)
    return torch.frombuffer(buf, dtype=torch.int64), spans


def unpack_int64(flat: torch.Tensor, spans: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Views of the packed int64 inputs by name (``graph_in`` as its [3, Bp] matrix)."""
    out = {name: flat[off : off + n] for name, (off, n) in spans.items()}
    if "graph_in" in out:
        out["graph_in"] = out["graph_in"].view(3, -1)
    return out
