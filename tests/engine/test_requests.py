"""Request semantics through the engine: validation, stops, seeds, n, logprobs, cancellation."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve
from aserve.errors import ContextLengthError, InvalidRequestError, ModelLoadError, ModelNotFoundError
from tests.hosting import hosted_engine
from tests.tiny import hf_greedy


@pytest.fixture(scope="module")
async def engine(tiny_llama: tuple[Path, Any]) -> AsyncIterator[aserve.Engine]:
    async with hosted_engine(model=str(tiny_llama[0]), debug=True, max_context=256, warmup=False) as eng:
        yield eng


def _prompt(seed: int, n: int = 8) -> list[int]:
    rng = random.Random(seed)
    return [1] + [rng.randrange(3, 384) for _ in range(n)]


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 1.5}, "max_tokens"),  # 0 is allowed: the prompt only (echo)
        ({"max_tokens": -3}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": ("",)}, "stop"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": {5: 100.5}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": [(5, 1.0), (5, 2.0)]}, "logit_bias"),
        ({"logit_bias": {5: math.inf}}, "logit_bias"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "min_tokens"),
        # Wrong types get the typed error too, not a TypeError from deep inside.
        ({"stop": None}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": None}, "stop_token_ids"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
        ({"logit_bias": None}, "logit_bias"),
        ({"logit_bias": 3}, "logit_bias"),
        ({"structured_outputs": "json"}, "structured_outputs"),
        ({"structured_outputs": {"choice": 7}}, "structured_outputs"),
        ({"ignore_eos": None}, "ignore_eos"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        aserve.SamplingParams(**kwargs)
    assert info.value.param == param
    assert param in str(info.value)


async def test_bad_prompts_raise_typed_errors_and_do_not_disturb_running(engine: aserve.Engine) -> None:
    params = aserve.SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    alone = await engine.complete(_prompt(1), params)
    results: list[aserve.CompletionResult] = []

    async def running() -> None:
        results.append(await engine.complete(_prompt(1), params))

    async with anyio.create_task_group() as tg:
        tg.start_soon(running)
        await anyio.sleep(0.01)
        with pytest.raises(InvalidRequestError, match="empty"):
            await engine.complete("", params)
        with pytest.raises(InvalidRequestError, match="empty"):
            await engine.complete([], params)
        with pytest.raises(ContextLengthError, match="256"):
            await engine.complete([5] * 300, params)
        with pytest.raises(InvalidRequestError, match="token ids"):
            await engine.complete([1, 10_000_000], params)
        with pytest.raises(InvalidRequestError):
            await engine.complete("hi", {"max_tokens": 3})  # type: ignore[arg-type]
        for prompt in (None, 123, b"abc", {"a": 1}):
            with pytest.raises(InvalidRequestError, match="prompt must be"):
                await engine.complete(prompt, params)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="list of prompts"):
            await engine.complete_many("hey", params)
    assert results[0].token_ids == alone.token_ids


async def test_unknown_model_and_truncated_gguf(tmp_path: Path, default_gguf: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="gemma-3-270m"):
        async with aserve.Engine(model="no-such-model"):
            pass
    bad = tmp_path / "truncated.gguf"
    with default_gguf.open("rb") as f:
        bad.write_bytes(f.read(2_000_000))
    with pytest.raises(ModelLoadError):
        async with aserve.Engine(model=str(bad)):
            pass


async def test_an_engine_starts_once(tiny_llama: tuple[Path, Any]) -> None:
    """Starting an engine again, while it runs or after it closed, is refused with a typed
    error and leaves nothing behind (it used to load a second model and start a second loop)."""
    eng = aserve.Engine(model=str(tiny_llama[0]), max_context=64, warmup=False)
    with pytest.raises(aserve.EngineClosedError, match="not started"):
        eng.stats()
    threads = {t.name for t in threading.enumerate()}
    async with eng:
        with pytest.raises(aserve.EngineClosedError, match="already started"):
            await eng.start()
        r = await eng.complete([1, 5, 6], aserve.SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        assert len(r.token_ids) == 3
    assert eng.stats().requests_finished == 1  # stats stay readable after close
    with pytest.raises(aserve.EngineClosedError, match="closed"):
        async with eng:
            pass
    for _ in range(50):  # the stream threads exit as the engine closes
        left = {t.name for t in threading.enumerate() if t.is_alive()} - threads
        if not left:
            break
        await anyio.sleep(0.1)
    assert not left


def test_bad_max_context() -> None:
    for bad in (0, -5, 1):
        with pytest.raises(InvalidRequestError, match="max_context"):
            aserve.Engine(max_context=bad)


def test_unknown_engine_option() -> None:
    with pytest.raises(TypeError, match="max_runing"):
        aserve.Engine(max_runing=3)


# -- stopping ---------------------------------------------------------------------------------


async def test_max_tokens_one_and_length(engine: aserve.Engine) -> None:
    r = await engine.complete(_prompt(2), aserve.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    assert len(r.token_ids) == 1 and r.finish_reason == "length"
    assert r.usage.completion_tokens == 1 and r.usage.prompt_tokens == 9


async def test_stop_token_ids(engine: aserve.Engine, tiny_llama: tuple[Path, Any]) -> None:
    ref, _ = hf_greedy(tiny_llama[1], _prompt(3), 20)
    stop_at = 6
    target = ref[stop_at]
    first = ref.index(target)
    r = await engine.complete(
        _prompt(3), aserve.SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=(target,))
    )
    assert r.token_ids == ref[: first + 1]
    assert r.finish_reason == "stop" and r.outputs[0].stop_reason == target


async def test_eos_stops_unless_ignored(eos_llama: tuple[Path, Any]) -> None:
    path, hf = eos_llama
    found = None
    for seed in range(100):
        ref, _ = hf_greedy(hf, _prompt(seed, 4), 30)
        if 2 in ref[1:]:
            found = seed
            break
    assert found is not None, "the boosted EOS never appears; adjust the fixture"
    cut = ref.index(2)
    async with aserve.Engine(model=str(path), debug=True, warmup=False) as eng:
        r = await eng.complete(_prompt(found, 4), aserve.SamplingParams(max_tokens=30, temperature=0))
        r2 = await eng.complete(_prompt(found, 4), aserve.SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    assert r.token_ids == ref[: cut + 1] and r.finish_reason == "stop" and r.outputs[0].stop_reason is None
    assert r2.token_ids == ref and r2.finish_reason == "length"


async def test_stop_string_never_streamed(engine: aserve.Engine) -> None:
    base = aserve.SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    full = await engine.complete(_prompt(4), base)
    text = full.text
    assert len(text) > 12
    stop = text[8:11]  # a string that occurs in the greedy output
    at = text.find(stop)
    params = base.with_updates(stop=(stop, "zzzz-never"))
    streamed = []
    async for d in engine.generate(_prompt(4), params):
        streamed.append(d.text)
        assert stop not in "".join(streamed)
    assert "".join(streamed) == text[:at]
    r = await engine.complete(_prompt(4), params)
    assert r.text == text[:at] and r.finish_reason == "stop" and r.outputs[0].stop_reason == stop
    incl = await engine.complete(_prompt(4), params.with_updates(include_stop_str_in_output=True))
    assert incl.text == text[: at + len(stop)]


async def test_stream_interval_chunks_and_same_output(engine: aserve.Engine, tiny_llama: tuple[Path, Any]) -> None:
    """``stream_interval=5``: the first tokens come alone, later chunks carry at least 5 tokens
    (or end the choice), and tokens and text equal the interval-1 engine's ``complete``."""
    every = 5
    greedy = aserve.SamplingParams(max_tokens=37, temperature=0, ignore_eos=True)
    stop_text = (await engine.complete(_prompt(4), greedy)).text[8:11]
    cases = [
        (_prompt(4), greedy),
        (_prompt(4), greedy.with_updates(stop=(stop_text,))),
        (_prompt(7, 20), aserve.SamplingParams(max_tokens=23, temperature=0.8, seed=9, n=2, ignore_eos=True)),
        (_prompt(8), aserve.SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)),
    ]
    expected = [await engine.complete(p, sp) for p, sp in cases]
    got: dict[tuple[int, bool], list[aserve.Delta]] = {}

    async def one(eng: aserve.Engine, i: int, slow: bool) -> None:
        deltas = got.setdefault((i, slow), [])
        async for d in eng.generate(*cases[i]):
            deltas.append(d)
            if slow:
                await anyio.sleep(0.01)  # a reader that falls behind takes bigger chunks

    async with aserve.Engine(model=str(tiny_llama[0]), debug=True, max_context=256, warmup=False,
                             stream_interval=every) as eng:  # fmt: skip
        async with anyio.create_task_group() as tg:
            for i in range(len(cases)):
                for slow in (False, True):
                    tg.start_soon(one, eng, i, slow)
        ledger = eng.ledger()
        assert ledger.balanced and ledger.all_free
    for (i, _slow), deltas in got.items():
        for out in expected[i].outputs:
            mine = [d for d in deltas if d.index == out.index]
            assert [t for d in mine for t in d.token_ids] == out.token_ids
            assert "".join(d.text for d in mine) == out.text
            assert mine[-1].finish_reason == out.finish_reason
            assert all(d.finish_reason is None for d in mine[:-1])
            # Every chunk but the first and the last carries a full interval.
            assert all(len(d.token_ids) >= every for d in mine[1:-1]), [len(d.token_ids) for d in mine]
            assert len(mine) <= 2 + len(out.token_ids) // every


async def test_logit_bias_matches_transformers_sequence_bias(
    engine: aserve.Engine, tiny_llama: tuple[Path, Any]
) -> None:
    """Greedy with ``logit_bias`` equals transformers' greedy with the same ``sequence_bias``
    (single-token sequences add the bias to the logits), batched with unbiased requests."""
    hf = tiny_llama[1]
    prompt = _prompt(11)
    plain, _ = hf_greedy(hf, prompt, 16)
    # Push down the two tokens greedy picks most, pull up one it never picks.
    common = sorted(set(plain), key=plain.count, reverse=True)[:2]
    favoured = next(t for t in range(5, 384) if t not in plain)
    bias = {common[0]: -4.0, common[1]: -2.5, favoured: 2.0}
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0,
                      sequence_bias={(t,): b for t, b in bias.items()})  # fmt: skip
    ref = out[0, len(prompt) :].tolist()
    assert ref != plain  # the bias changes the continuation, so the test can tell
    params = aserve.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logit_bias=bias)
    got: dict[int, list[int]] = {}

    async def one(i: int, p: aserve.SamplingParams) -> None:
        got[i] = (await engine.complete(prompt, p)).token_ids

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0, params)
        tg.start_soon(one, 1, params.with_updates(logit_bias=()))
        tg.start_soon(one, 2, params.with_updates(logprobs=2))
    assert got == {0: ref, 1: plain, 2: ref}
    # Logprobs stay the model's own: the biased pick is scored under the unbiased distribution.
    r = await engine.complete(prompt, params.with_updates(logprobs=0, max_tokens=1))
    logits = hf(torch.tensor([prompt])).logits[0, -1].float()
    assert r.outputs[0].logprobs is not None
    assert r.outputs[0].logprobs[0].logprob == pytest.approx(torch.log_softmax(logits, -1)[ref[0]].item(), abs=1e-4)
    # A sampled request never picks a token biased by -100.
    banned = {t: -100.0 for t in range(hf.config.vocab_size) if t not in (7, 9)}
    sampled = await engine.complete(
        prompt, aserve.SamplingParams(max_tokens=24, temperature=1.5, seed=3, ignore_eos=True, logit_bias=banned)
    )
    assert set(sampled.token_ids) <= {7, 9}
    with pytest.raises(InvalidRequestError) as info:
        await engine.complete(prompt, params.with_updates(logit_bias={10**6: 1.0}))
    assert info.value.param == "logit_bias"


def test_min_tokens_matches_transformers_min_new_tokens(eos_llama: tuple[Path, Any]) -> None:
    """``min_tokens`` against transformers' ``min_new_tokens``: EOS (and stop token ids) are
    banned until then, so a greedy run that would stop early runs on, then stops as
    transformers does. Stop strings do not end a request before ``min_tokens`` either."""
    path, hf = eos_llama

    def hf_run(prompt: list[int], stop: list[int], min_new: int) -> list[int]:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=30, min_new_tokens=min_new, do_sample=False,
                          eos_token_id=stop, pad_token_id=0)  # fmt: skip
        return list(out[0, len(prompt) :].tolist())

    found = next(s for s in range(100) if 2 in hf_run(_prompt(s, 4), [2], 0)[1:8])
    prompt = _prompt(found, 4)
    early = hf_run(prompt, [2], 0)
    cut = early.index(2) + 1
    ref = hf_run(prompt, [2], cut + 4)
    assert len(ref) >= cut + 4 and ref != early  # the test can tell min_tokens from none
    plain = hf_run(prompt, [], 0)  # no stop at all: the free-running greedy continuation
    target = plain[3]
    stop_ref = hf_run(prompt, [target], 6)
    assert len(stop_ref) > 4  # without min_tokens it would stop at the 4th token

    async def main() -> None:
        async with aserve.Engine(model=str(path), debug=True, warmup=False) as eng:
            p = aserve.SamplingParams(max_tokens=30, temperature=0)
            got = await eng.complete(prompt, p.with_updates(min_tokens=cut + 4))
            assert got.token_ids == ref
            assert got.finish_reason == ("stop" if ref[-1] == 2 else "length")
            assert (await eng.complete(prompt, p)).token_ids == early  # without it: the early stop
            q = p.with_updates(ignore_eos=True, stop_token_ids=(target,), min_tokens=6)
            assert (await eng.complete(prompt, q)).token_ids == stop_ref
            free = await eng.complete(prompt, p.with_updates(ignore_eos=True))
            stop = free.text[2:5]  # occurs in the first tokens' text
            soon = await eng.complete(prompt, p.with_updates(ignore_eos=True, stop=(stop,)))
            assert soon.finish_reason == "stop" and len(soon.token_ids) < 20
            late = await eng.complete(prompt, p.with_updates(ignore_eos=True, stop=(stop,), min_tokens=20))
            assert len(late.token_ids) >= 20 and late.token_ids == free.token_ids[: len(late.token_ids)]
            assert eng.ledger().all_free

    anyio.run(main)


# -- sampling ---------------------------------------------------------------------------------


async def test_seeded_sampling_independent_of_batch(engine: aserve.Engine) -> None:
    params = aserve.SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = await engine.complete(_prompt(5), params)
    out: dict[int, aserve.CompletionResult] = {}

    async def one(i: int, prompt: list[int], p: aserve.SamplingParams) -> None:
        out[i] = await engine.complete(prompt, p)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i, _prompt(100 + i, 3 + 7 * i), params.with_updates(seed=i, top_k=5 * i))
        tg.start_soon(one, 99, _prompt(5), params)
    assert out[99].token_ids == alone.token_ids
    other = await engine.complete(_prompt(5), params.with_updates(seed=4321))
    assert other.token_ids != alone.token_ids


async def test_n_choices(engine: aserve.Engine) -> None:
    params = aserve.SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=3, ignore_eos=True)
    r = await engine.complete(_prompt(6), params)
    assert [o.index for o in r.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in r.outputs}) == 3  # different seeds per choice
    assert r.usage.completion_tokens == 36 and r.usage.prompt_tokens == 9
    # choice i is the same as a single request seeded seed + i
    single = await engine.complete(_prompt(6), params.with_updates(n=1, seed=8))
    assert single.token_ids == r.outputs[1].token_ids
    deltas = [d async for d in engine.generate(_prompt(6), params)]
    for i in range(3):
        assert [t for d in deltas if d.index == i for t in d.token_ids] == r.outputs[i].token_ids


async def test_n_choices_with_a_seed_at_the_top_of_the_range(engine: aserve.Engine) -> None:
    """Choice i is seeded seed + i, wrapped into the signed 64-bit range: a seed of 2**63 - 1
    with n = 2 gives its second choice -2**63 (it used to overflow at launch and fail the
    engine, ending every request in flight)."""
    top = 2**63 - 1
    params = aserve.SamplingParams(max_tokens=8, temperature=1.0, seed=top, n=2, ignore_eos=True)
    other = aserve.SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    async with anyio.create_task_group() as tg:
        bystander: list[aserve.CompletionResult] = []

        async def run_other() -> None:
            bystander.append(await engine.complete(_prompt(8), other))

        tg.start_soon(run_other)
        r = await engine.complete(_prompt(7), params)
    assert engine.failure is None
    assert len(bystander[0].token_ids) == 40
    wrapped = await engine.complete(_prompt(7), params.with_updates(n=1, seed=-(2**63)))
    assert r.outputs[1].token_ids == wrapped.token_ids
    assert aserve.sampling_params.choice_seed(5, 2) == 7


async def test_logprobs_match_reference(engine: aserve.Engine, tiny_llama: tuple[Path, Any]) -> None:
    hf = tiny_llama[1]
    prompt = _prompt(7)
    r = await engine.complete(prompt, aserve.SamplingParams(max_tokens=5, temperature=0, logprobs=3, ignore_eos=True))
    assert r.logprobs is not None and len(r.logprobs) == 5
    ids = list(prompt)
    for lp in r.logprobs:
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1].double(), -1)
        top = torch.topk(ref, 3)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert all(abs(a - b) < 1e-3 for (_, a), b in zip(lp.top, top.values.tolist()))
        assert abs(lp.logprob - ref[lp.token_id].item()) < 1e-3
        ids.append(lp.token_id)


async def test_penalties_change_output(engine: aserve.Engine) -> None:
    base = aserve.SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain = await engine.complete(_prompt(8), base)
    pen = await engine.complete(_prompt(8), base.with_updates(frequency_penalty=2.0, presence_penalty=2.0))
    rep = await engine.complete(_prompt(8), base.with_updates(repetition_penalty=2.0))
    assert plain.token_ids != pen.token_ids
    assert plain.token_ids != rep.token_ids
    # A strong frequency penalty makes repeats rarer than in the plain greedy output.
    assert len(set(pen.token_ids)) >= len(set(plain.token_ids))


# -- cancellation and load ---------------------------------------------------------------------


async def test_many_concurrent_with_cancellations(engine: aserve.Engine) -> None:
    rng = random.Random(0)
    finished = 0
    cancelled = 0

    async def complete_one(i: int) -> None:
        nonlocal finished
        p = aserve.SamplingParams(max_tokens=rng.randint(1, 24), temperature=rng.choice([0, 1.0]), ignore_eos=True)
        r = await engine.complete(_prompt(1000 + i, rng.randint(1, 60)), p)
        assert len(r.token_ids) == p.max_tokens
        finished += 1

    async def stream_and_leave(i: int) -> None:
        nonlocal cancelled
        p = aserve.SamplingParams(max_tokens=200, temperature=1.0, ignore_eos=True)
        stop_after = rng.randint(0, 5)
        n = 0
        async for _ in engine.generate(_prompt(2000 + i, rng.randint(1, 60)), p):
            n += 1
            if n > stop_after:
                break
        cancelled += 1

    async def cancel_by_scope(i: int) -> None:
        nonlocal cancelled
        with anyio.move_on_after(rng.random() * 0.3):
            await engine.complete(_prompt(3000 + i), aserve.SamplingParams(max_tokens=200, ignore_eos=True))
        cancelled += 1

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(complete_one, i)
        for i in range(25):
            tg.start_soon(stream_and_leave, i)
            tg.start_soon(cancel_by_scope, i)
    assert finished == 200 and cancelled == 50
    await _wait_all_free(engine)


async def _wait_all_free(engine: aserve.Engine) -> None:
    # Aborted requests are freed at the commit of the last step that read them.
    with anyio.fail_after(10):
        while not engine.ledger().all_free:
            await anyio.sleep(0.01)
    assert engine.ledger().balanced
    st = engine.stats()
    assert st.running == 0 and st.waiting == 0


def test_trio_backend(tiny_llama: tuple[Path, Any]) -> None:
    async def main() -> list[int]:
        async with aserve.Engine(model=str(tiny_llama[0]), warmup=False) as eng:
            r = await eng.complete(_prompt(9), aserve.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
            assert eng.ledger().all_free
            return r.token_ids

    ref, _ = hf_greedy(tiny_llama[1], _prompt(9), 6)
    assert anyio.run(main, backend="trio") == ref


async def test_requests_submitted_together_are_admitted_together(tiny_llama: tuple[Path, Any]) -> None:
    # 24 tasks started in one go: their prompts reach the scheduler before it plans, so
    # the first step prefills all of them (not one request per step, as a per-item ingest
    # loop that yields between items would do).
    async with aserve.Engine(model=str(tiny_llama[0]), max_context=256, warmup=False) as eng:
        params = aserve.SamplingParams(max_tokens=3, temperature=0)

        async def one(i: int) -> None:
            await eng.complete(_prompt(i), params)

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(one, i)
        first = eng.step_records()[0]
    assert first.num_seqs == 24 and first.num_decodes == 0


def test_gc_freeze_holds_while_serving_and_is_undone_at_close(tiny_llama: tuple[Path, Any]) -> None:
    """gc_freeze: the objects alive after start-up (the warm-up's greedy and sampled requests
    included) are out of the cyclic collector's reach while the engine serves, and back in
    it once the engine is closed; the youngest generation's threshold is raised while any
    such engine runs. Off by default on a CPU, on with CUDA."""
    import gc

    from aserve.config import EngineConfig
    from aserve.engine.engine import GC_GEN0_THRESHOLD

    assert not EngineConfig(device="cpu").use_gc_freeze
    assert EngineConfig(device="cuda").use_gc_freeze  # config only: nothing touches a GPU

    before = gc.get_threshold()

    async def run() -> None:
        assert gc.get_freeze_count() == 0
        async with aserve.Engine(model=str(tiny_llama[0]), gc_freeze=True, max_context=256) as eng:
            assert gc.get_freeze_count() > 10_000  # torch, the model, the engine
            assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD
            async with aserve.Engine(model=str(tiny_llama[0]), gc_freeze=True, max_context=256):
                pass  # a second engine closing first leaves the first one's threshold alone
            assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD
            r = await eng.complete(_prompt(3), aserve.SamplingParams(max_tokens=4, temperature=0))
            assert len(r.token_ids) == 4
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == before

    anyio.run(run)
