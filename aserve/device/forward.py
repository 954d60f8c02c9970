"""The device side of a step: its inputs on the device in, its tokens in the FutureMap out.

:class:`StepForward` is what a launch (``aserve/device/runner.py``) runs on the forward stream
(on CUDA) or the worker thread (on a CPU): the forward (a decode graph's replay, an extend
graph's, or the model eagerly), then the sampler, or nothing where the graph's argmax already is
the step's tokens. A split step (constrained rows whose masks wait for the commit) runs
:meth:`StepForward.forward` at launch and :meth:`StepForward.sample` once the masks are there.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.extend_graphs import ExtendGraphs
from aserve.device.future_map import FutureMap
from aserve.device.inputs import DeviceInputs
from aserve.kv.pool import KVPool
from aserve.models.causal_lm import CausalLM
from aserve.sampling.sampler import (
    SampleOutput,
    apply_masks_,
    candidate_width,
    plain_greedy,
    prompt_logprobs,
    sample,
    sample_candidates,
)


class StepForward:
    """A step's forward and sampler, from its :class:`DeviceInputs`, and their counters."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        device: torch.device,
        future_map: FutureMap,
        attention_backend: str,
        decode_graphs: DecodeGraphs | None,
        extend_graphs: ExtendGraphs | None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.device = device
        self.future_map = future_map
        self.attention_backend = attention_backend
        self.decode_graphs = decode_graphs
        self.extend_graphs = extend_graphs
        self.masked_graph_steps = 0  # greedy graph steps with constrained rows (a masked argmax)
        self.candidate_steps = 0  # CPU top-k steps sampled from the head's candidates alone
        self.candidate_fallbacks = 0  # ... that found a tie past the candidates (full logits)

    def run(self, dev: DeviceInputs) -> SampleOutput:
        """Everything between 'inputs on the device' and 'tokens in the FutureMap'."""
        return self.sample(self.forward(dev), dev)

    def sample(self, fwd: SampleOutput | Logits, dev: DeviceInputs) -> SampleOutput:
        """The sampler after :meth:`forward` (nothing on the greedy graph fast path; a masked
        argmax when that step has constrained rows)."""
        if isinstance(fwd, SampleOutput):
            return fwd
        if dev.sbatch is None:
            return self._masked_argmax(fwd.logits, dev, fwd.argmax)
        out = self._sample_and_publish(fwd.logits, dev, fwd.gathered)
        if fwd.prompt is not None:
            out.prompt_logprobs, out.prompt_top_ids, out.prompt_top_logprobs = fwd.prompt
        return out

    def forward(self, dev: DeviceInputs) -> SampleOutput | Logits:
        """The forward: the logits to sample from, or the tokens themselves on the greedy graph
        fast path (the graph's argmax)."""
        if dev.graph_in is not None:
            return self._graph_decode(dev, dev.graph_in)
        f = dev.fields
        assert f is not None, "a step without a graph input has the general fields"
        table = self.pool.table_device
        # The new tokens' table entries: each sequence's row once a token (``output_size`` is
        # known on the host: no sync), at the tokens' positions; then a cache hit's prefix.
        token_rows = torch.repeat_interleave(dev.rows, f.extend, output_size=f.positions.shape[0])
        table[token_rows, f.positions] = f.slots
        if f.table_rows.shape[0]:
            table[f.table_rows, f.table_cols] = f.table_slots
        input_ids = f.input_ids
        gathered = None
        if f.decode_rows.numel() > 0:
            gathered = self.future_map.gather(f.decode_rows, f.decode_gens)
        if dev.xgraph_in is not None:
            assert self.extend_graphs is not None  # no inference_mode(): see _graph_decode
            logits = self.extend_graphs.run(dev.xgraph_in, f.decode_token_idx, gathered)[: f.logits_idx.shape[0]]
            if dev.sbatch is not None:
                return Logits(logits, gathered, None)
            # Every row plain greedy (no sampler inputs were built): the argmax is the output.
            tokens = logits.argmax(dim=-1)
            self._publish(dev, tokens)
            return SampleOutput(tokens, None, None, None)
        if gathered is not None:
            input_ids = input_ids.index_put((f.decode_token_idx,), gathered)
        logits_idx = f.logits_idx
        num_prompt_rows = f.plp_idx.shape[0]  # host-known shape: no sync
        if num_prompt_rows:
            logits_idx = torch.cat((f.logits_idx, f.plp_idx))
        meta = AttentionMetadata(
            positions=f.positions,
            out_cache_loc=f.slots,
            req_pool_indices=dev.rows,
            prefix_lens=f.prefix,
            extend_lens=f.extend,
            seq_lens=f.prefix + f.extend,
            req_to_token=table,
            logits_indices=logits_idx,
            prefix_lens_cpu=dev.prefix_cpu,
            extend_lens_cpu=dev.extend_cpu,
            backend=self.attention_backend,
        )
        with torch.inference_mode():
            model = self.model
            if self.device.type == "cpu" and not num_prompt_rows and isinstance(model, CausalLM):
                width = candidate_width(dev.sbatch)
                if width or plain_greedy(dev.sbatch):
                    # The sampler would read the logits for the drawn tokens alone: ask the head.
                    return self._cpu_head(model, input_ids, meta, dev, gathered, width)
            logits = self.model(input_ids, meta, self.pool.kv_cache)  # [B + E, V]
            if not num_prompt_rows:
                return Logits(logits, gathered, None)
            b = f.logits_idx.shape[0]
            prompt = prompt_logprobs(logits[b:], f.plp_target, dev.plp_top)
        return Logits(logits[:b], gathered, prompt)

    def _cpu_head(
        self,
        model: CausalLM,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        dev: DeviceInputs,
        gathered: torch.Tensor | None,
        width: int,
    ) -> SampleOutput | Logits:
        """A CPU step without prompt logprobs whose sampler would read the logits for the drawn
        tokens alone: the head answers without writing the [B, vocab] logits (on the int8 GGUF
        head; ``CausalLM.greedy`` / ``candidates``). Every row greedy (``width`` 0): its argmax.
        Every sampled row with a top-k: ``sample_candidates`` on each row's top ``width``, the
        same tokens as ``sample``; where the head has no such kernel, or a tie may run past the
        candidates, the step's logits go to the sampler."""
        h = model(input_ids, meta, self.pool.kv_cache, head=False)  # [B, hidden]
        if not width:
            tokens: torch.Tensor | None = model.greedy(h)  # [B]
        else:
            assert dev.sbatch is not None
            cand = model.candidates(h, width)
            tokens = sample_candidates(*cand, dev.sbatch) if cand is not None else None
            self.candidate_steps += tokens is not None
            self.candidate_fallbacks += cand is not None and tokens is None
        if tokens is None:
            return Logits(model.logits(h), gathered, None)
        self._publish(dev, tokens)
        return SampleOutput(tokens, None, None, None)

    def _graph_decode(self, dev: DeviceInputs, graph_in: torch.Tensor) -> SampleOutput | Logits:
        """An all-decode step from a captured graph (table update, gather, forward, greedy
        publish inside); the sampler runs after it only when some row does not decode greedily."""
        graphs, fm = self.decode_graphs, self.future_map
        assert graphs is not None
        fm.check(dev.rows, dev.gens)  # every row decodes: rows are the decode rows
        # No inference_mode() here: a replay records no autograd state, and the CPU body
        # enters it itself (a profile on the H200 charged ~0.5 ms per step to its __exit__).
        g = graphs.run(graph_in)
        b = dev.rows.shape[0]
        if fm.debug:
            fm.generations[dev.rows] = dev.gens
        if dev.sbatch is None and dev.mask_rows is None:
            # Every row plain greedy (the fast path of ``build_inputs``): the graph's argmax is
            # the output. A copy: the graph's buffer is rewritten by the next replay, maybe
            # before this step's device-to-host copy ran on the copy stream.
            return SampleOutput(g.tokens[:b].clone(), None, None, None)
        # The sampler works in float32; a masked argmax takes the head's dtype as it is.
        if dev.sbatch is None:
            return Logits(g.logits[:b], g.input_ids[:b], None, g.tokens[:b])
        return Logits(g.logits[:b].float(), g.input_ids[:b], None)

    def _masked_argmax(self, logits: torch.Tensor, dev: DeviceInputs, argmax: torch.Tensor | None) -> SampleOutput:
        """A greedy step with constrained rows (every row of a decode-only step samples): the
        argmax of each constrained row over its mask, the plain argmax elsewhere (``argmax``,
        the graph's, when given), published over the graph's own tokens.

        With :data:`FUSED_ARGMAX_ROWS` constrained rows or more, on CUDA, one masked-argmax
        kernel launch that neither writes the logits nor reads a disallowed token's logit and
        publishes the constrained rows' tokens itself (``masked_argmax_``; the graph published
        the others). Otherwise the masks are applied in place (the buffer is the graph's,
        rewritten by its next replay) before the argmax."""
        self.masked_graph_steps += 1
        if dev.automata is not None:  # every constrained row in a token automaton: one launch
            # Set on decode-graph steps only (``mask_rows``), which bring the graph's argmax: a
            # copy, as below.
            assert argmax is not None, "a one-launch draw after a decode graph"
            auto, packed = dev.automata
            fm = self.future_map
            tokens = auto.argmax_(argmax.clone(), logits, packed, dev.rows, fm.states, (fm.tokens, dev.rows))
            return SampleOutput(tokens, None, None, None)
        assert dev.mask_rows is not None and dev.mask_bits is not None, "a masked step without its masks"
        if logits.is_cuda and dev.mask_rows.shape[0] >= FUSED_ARGMAX_ROWS:
            from aserve.kernels.bitmask import masked_argmax_

            if argmax is not None:
                # A copy: the graph's tokens are rewritten by its next replay, maybe before this
                # step's copy to the host ran on the copy stream.
                tokens = argmax.clone()
                masked_argmax_(tokens, logits, dev.mask_rows, dev.mask_bits, (self.future_map.tokens, dev.rows))
                return SampleOutput(tokens, None, None, None)
            tokens = masked_argmax_(logits.argmax(dim=-1), logits, dev.mask_rows, dev.mask_bits)
        else:
            # On CUDA the masks are a Triton kernel's raw write, which autograd does not see:
            # no inference_mode() (a profile on the H100 host charged ~0.23 ms a step to its
            # exit). On a CPU they are torch ops on the graph's inference tensor, which need it.
            with contextlib.nullcontext() if logits.is_cuda else torch.inference_mode():
                apply_masks_(logits, dev.mask_rows, dev.mask_bits)
                tokens = logits.argmax(dim=-1)
        self.future_map.publish(dev.rows, tokens, dev.gens)
        return SampleOutput(tokens, None, None, None)

    def _sample_and_publish(
        self, logits: torch.Tensor, dev: DeviceInputs, gathered: torch.Tensor | None
    ) -> SampleOutput:
        f, sbatch = dev.fields, dev.sbatch
        assert f is not None and sbatch is not None, "the sampler runs on general-path steps only"
        with torch.inference_mode():
            if sbatch.output_tokens is not None and gathered is not None and f.pending_b.numel() > 0:
                sbatch.output_tokens[f.pending_b, f.pending_c] = gathered[f.pending_decode]
            out = sample(logits, sbatch)
        self._publish(dev, out.token_ids)
        return out

    def _publish(self, dev: DeviceInputs, tokens: torch.Tensor) -> None:
        """The sampled sequences' tokens ([B]) into the FutureMap, for the next step to gather."""
        assert dev.fields is not None
        idx = dev.fields.sample_idx  # host-built indices: no data-dependent shapes, no sync
        self.future_map.publish(dev.rows[idx], tokens[idx], dev.gens[idx])


# Constrained greedy rows from which a step takes the fused masked argmax. Session 20 measured
# its first form (two Triton launches, ~150 us at any size on the H100 host) behind the in-place
# masks below 128 rows; the one-launch form is measured in docs/benchmarks.md (session 21).
FUSED_ARGMAX_ROWS = 1


class Logits(NamedTuple):
    """A forward's result before sampling: the logits of the sampled rows, the decodes' input
    tokens (penalised requests read them), and the prompt logprobs when asked for."""

    logits: torch.Tensor
    gathered: torch.Tensor | None
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    argmax: torch.Tensor | None = None  # a graph's own argmax of ``logits``, when it took one
