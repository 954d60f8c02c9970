"""The engine core and front ends over real ZeroMQ sockets, in one process: a tiny model, the
core's ``CoreService`` and ``EngineClient``s (what each front-end process runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from aserve.ipc.client import EngineClient
from aserve.ipc.core import CoreService


async def test_remote_results_equal_embedded_and_readiness_waits_for_every_front_end(
    tiny_llama: tuple[Path, Any], tmp_path: Path
) -> None:
    address = f"ipc://{tmp_path}/core"
    prompts = [[1, 5 + i, 9, 12] for i in range(4)]
    greedy = aserve.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    sampled = aserve.SamplingParams(max_tokens=12, temperature=0.9, seed=7, n=2, logprobs=2, ignore_eos=True)
    async with (
        aserve.Engine(model=str(tiny_llama[0]), warmup=False, debug=True) as engine,
        CoreService(engine, address, expected_front_ends=2).running() as core,
    ):
        local = [await engine.complete(p, greedy) for p in prompts] + [await engine.complete(prompts[0], sampled)]
        async with EngineClient(address, name="fe-a") as a:
            # One of two front ends is ready: the service is not (no /health 200 yet).
            with anyio.move_on_after(1.0):
                await a.service_ready.wait()
            assert not a.service_ready.is_set()
            async with EngineClient(address, name="fe-b") as b:
                with anyio.fail_after(10):
                    await a.service_ready.wait()
                    await b.service_ready.wait()
                remote = [await (a if i % 2 else b).complete(p, greedy) for i, p in enumerate(prompts)]
                remote.append(await a.complete(prompts[0], sampled))
                # Streamed through the IPC path: the same ids, and text equal to the whole result's.
                stream = b.open_stream(prompts[1], greedy)
                await stream.admitted()
                text, ids = "", []
                async for d in stream:
                    text, ids = text + d.text, ids + d.token_ids
                sent_before = core.messages_sent
        for lo, re in zip(local, remote, strict=True):
            assert [o.token_ids for o in re.outputs] == [o.token_ids for o in lo.outputs]
            assert [o.text for o in re.outputs] == [o.text for o in lo.outputs]
            assert [o.finish_reason for o in re.outputs] == [o.finish_reason for o in lo.outputs]
        assert remote[-1].outputs[0].logprobs == local[-1].outputs[0].logprobs
        assert ids == local[1].token_ids and text == local[1].text
        assert sent_before > 0
        with anyio.fail_after(10):
            while not engine.ledger().all_free:  # the clients' exits released everything
                await anyio.sleep(0.01)


async def test_a_request_over_the_limits_raises_its_typed_error_at_once(
    tiny_llama: tuple[Path, Any], tmp_path: Path
) -> None:
    address = f"ipc://{tmp_path}/core"
    cfg = aserve.EngineConfig(model=str(tiny_llama[0]), warmup=False, max_waiting_requests=2)
    async with (
        aserve.Engine(cfg) as engine,
        CoreService(engine, address).running(),
        EngineClient(address, name="fe-a") as client,
    ):
        # The core's limits arrived in its Welcome: the front end refuses before sending anything.
        for bad, error in (
            (([1, 5, 9], aserve.SamplingParams(max_tokens=4, n=3)), aserve.EngineOverloadedError),
            (([1, 10**9], aserve.SamplingParams(max_tokens=4)), aserve.InvalidRequestError),
            (([1] * 600, aserve.SamplingParams(max_tokens=4)), aserve.ContextLengthError),
        ):
            try:
                client.open_stream(*bad)
            except error:
                continue
            raise AssertionError(f"{bad} was admitted")
        with pytest.raises(aserve.InvalidRequestError, match="list of prompts"):
            await client.complete_many("hey", aserve.SamplingParams(max_tokens=4))  # not three prompts h, e, y
        ok = await client.complete([1, 5, 9], aserve.SamplingParams(max_tokens=4, temperature=0))
        assert len(ok.token_ids) == 4


async def test_every_front_end_learns_of_the_engines_failure_at_once(
    tiny_llama: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault in the core's engine reaches every front end while the core still runs: the
    one whose request met it and one with nothing in flight both hold the EngineFailedError
    (what their /health then answers) and refuse new requests with it, before the core goes."""
    from aserve.models.causal_lm import CausalLM

    trigger = 333
    real_forward = CausalLM.forward

    def forward(self: CausalLM, input_ids: Any, *args: Any) -> Any:
        if int((input_ids == trigger).sum()) >= 3:
            raise RuntimeError("injected fault in the model's forward")
        return real_forward(self, input_ids, *args)

    monkeypatch.setattr(CausalLM, "forward", forward)
    address = f"ipc://{tmp_path}/core"
    async with (
        aserve.Engine(model=str(tiny_llama[0]), warmup=False, debug=True) as engine,
        CoreService(engine, address, expected_front_ends=2).running() as core,
        EngineClient(address, name="fe-a") as a,
        EngineClient(address, name="fe-b") as b,
    ):
        with anyio.fail_after(30):  # a hang guard, not a timing bound
            await a.service_ready.wait()
            await b.service_ready.wait()
        assert a.failure is None and b.failure is None
        with pytest.raises(aserve.EngineFailedError, match="injected fault"):
            await a.complete([1, trigger, trigger, trigger], aserve.SamplingParams(max_tokens=4))
        with anyio.fail_after(30):
            await b.failed.wait()
            await core.failure_told.wait()
        for fe in (a, b):
            assert isinstance(fe.failure, aserve.EngineFailedError) and "injected fault" in str(fe.failure)
            assert not fe.dead.is_set()  # the core is still there: it has only failed
            with pytest.raises(aserve.EngineFailedError):
                fe.open_stream([1, 5, 9], aserve.SamplingParams(max_tokens=2))


async def _through_a_front_end(
    path: Path, address: str, prompts: list[list[int]], params: list[aserve.SamplingParams], **opts: Any
) -> tuple[list[list[list[int]]], int, int, int]:
    """Every prompt at once through a core and one front end: each call's choices' token ids,
    and the core's ``Outputs`` messages, the engine's steps and the tokens over the run."""
    async with (
        aserve.Engine(model=str(path), warmup=False, debug=True, **opts) as engine,
        CoreService(engine, address).running() as core,
        EngineClient(address, name="fe-a") as client,
    ):
        results: list[Any] = [None] * len(prompts)

        async def one(i: int) -> None:
            results[i] = await client.complete(prompts[i], params[i])

        engine.reset_stats()
        sent_before = core.outputs_sent
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        ids = [[o.token_ids for o in r.outputs] for r in results]
        tokens = sum(len(t) for choices in ids for t in choices)
        return ids, core.outputs_sent - sent_before, engine.stats().num_steps, tokens


async def test_one_outputs_message_a_step_and_overlap_equals_serial_through_the_core(
    tiny_llama: tuple[Path, Any], tmp_path: Path
) -> None:
    """Through the core and a front end: the core sends that front end at most one ``Outputs``
    message a step, whatever the number of its requests (never one a token); and overlap on
    and off give the same tokens (greedy, and seeded sampling with ``n``)."""
    prompts = [[1, 5 + i, 9, 12 + i] for i in range(8)]
    params = [
        aserve.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        if i % 2
        else aserve.SamplingParams(max_tokens=16, temperature=0.9, seed=i, n=2, ignore_eos=True)
        for i in range(8)
    ]
    runs = {}
    for overlap in (True, False):
        address = f"ipc://{tmp_path}/core-{overlap}"
        runs[overlap] = await _through_a_front_end(tiny_llama[0], address, prompts, params, overlap=overlap)
    assert runs[True][0] == runs[False][0]
    for _ids, outputs_sent, steps, tokens in runs.values():
        assert tokens == 12 * 16  # 4 greedy calls, 4 calls of two choices
        assert 0 < outputs_sent <= steps  # one message a step at most, with every request's news
        assert outputs_sent < tokens // 4  # 12 choices ran together: far fewer messages than tokens


async def test_malformed_bytes_cost_the_core_nothing(tiny_llama: tuple[Path, Any], tmp_path: Path) -> None:
    """Bytes that are no message (or a message of the wrong shape) are logged and dropped: the
    core goes on serving its front ends."""
    import zmq
    import zmq.asyncio

    address = f"ipc://{tmp_path}/core"
    greedy = aserve.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    async with (
        aserve.Engine(model=str(tiny_llama[0]), warmup=False, debug=True) as engine,
        CoreService(engine, address).running(),
        EngineClient(address, name="fe-a") as client,
    ):
        before = await client.complete([1, 5, 9], greedy)
        ctx = zmq.asyncio.Context()
        intruder = ctx.socket(zmq.DEALER)
        intruder.setsockopt(zmq.IDENTITY, b"intruder")
        intruder.setsockopt(zmq.LINGER, 0)
        intruder.connect(address)
        try:
            for junk in (b"\x00not msgpack\xff", b"\x92\xa3Add\x01", b""):
                await intruder.send(junk)
            with anyio.fail_after(10):  # a hang guard: the core answers the intruder's first bytes
                await intruder.recv()  # its Welcome: the core read them and is alive
        finally:
            intruder.close()
            ctx.term()
        with anyio.fail_after(60):  # a hang guard: a core whose receive loop died never answers
            after = await client.complete([1, 5, 9], greedy)
        assert after.token_ids == before.token_ids
        with anyio.fail_after(10):
            while not engine.ledger().all_free:
                await anyio.sleep(0.01)


def test_default_front_ends_follow_the_cores_and_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``aserve serve`` without ``--api-workers``: none on a CPU (its cores run the model), and
    with CUDA one front end per two cores beyond two, at least one and at most eight."""
    import os

    from aserve.ipc.launcher import default_api_workers

    for cores, want in ((2, 1), (4, 1), (8, 3), (16, 7), (18, 8), (64, 8)):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert default_api_workers(aserve.EngineConfig(device="cuda")) == want, cores
        assert default_api_workers(aserve.EngineConfig(device="cpu")) == 0


async def test_a_loop_held_up_longer_than_the_timeouts_drops_nobody(
    tiny_llama: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seconds of synchronous work on the loop (a first grammar on a loaded machine took 3 s)
    leave the other side's messages unread, not missing: the core keeps the front end and its
    request, and the front end keeps the core. (Core and front end share this test's loop,
    so both are held up; each judges silence only after a beat of its own on time.)"""
    import time

    from aserve.ipc import client as client_module
    from aserve.ipc import core as core_module

    monkeypatch.setattr(core_module, "FRONT_END_TIMEOUT_S", 0.5)
    monkeypatch.setattr(client_module, "CORE_TIMEOUT_S", 0.8)
    monkeypatch.setattr(client_module, "HEARTBEAT_S", 0.1)
    address = f"ipc://{tmp_path}/core"
    params = aserve.SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    async with (
        aserve.Engine(model=str(tiny_llama[0]), warmup=False, debug=True) as engine,
        CoreService(engine, address).running() as core,
        EngineClient(address, name="fe-a") as client,
    ):
        with anyio.fail_after(30):  # a hang guard
            await client.service_ready.wait()
        stream = client.open_stream([1, 5, 9], params)
        await stream.admitted()
        ids: list[int] = []
        held = False
        async for delta in stream:
            ids += delta.token_ids
            if len(ids) >= 5 and not held:
                held = True
                time.sleep(2.0)  # noqa: ASYNC251 - the point: the whole loop held up, longer than both timeouts
        assert len(ids) == 40
        assert b"fe-a" in core.front_ends and not client.dead.is_set()


async def test_a_refused_prompt_list_leaves_nothing_running_or_remembered(
    tiny_llama: tuple[Path, Any], tmp_path: Path
) -> None:
    """Over IPC a list of prompts is admitted prompt by prompt: when the core refuses one (a
    full queue), the ones it took are aborted, as one process refuses the whole list before
    queueing any, and the client forgets every prompt's admission (they used to run on
    unread, and their entries stayed)."""
    address = f"ipc://{tmp_path}/core"
    cfg = aserve.EngineConfig(model=str(tiny_llama[0]), warmup=False, max_waiting_requests=2, max_running_requests=1)
    long = aserve.SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    async with (
        aserve.Engine(cfg) as engine,
        CoreService(engine, address).running(),
        EngineClient(address, name="fe-a") as client,
    ):
        with anyio.fail_after(60):
            await client.service_ready.wait()
            busy = client.open_stream([1, 2, 3], long)  # runs; the queue holds 2 more at most
            await busy.admitted()
            for _ in range(3):
                stream = client.open_streams([[1, 5, 6], [1, 7, 8], [1, 9, 10]], long)
                with pytest.raises(aserve.EngineOverloadedError):
                    await stream.admitted()
                with pytest.raises(aserve.EngineOverloadedError):
                    await client.complete_many([[1, 5, 6], [1, 7, 8], [1, 9, 10]], long)
            with anyio.fail_after(10):  # the prompts the core took are aborted: none waits behind `busy`
                while engine.scheduler.waiting:
                    await anyio.sleep(0.02)
            assert len(engine.scheduler.running) == 1
            await busy.aclose()
            while engine.scheduler.running or engine.scheduler.waiting:
                await anyio.sleep(0.05)
        assert not client.live and not client._admitted and not client._rejected
        assert engine.ledger().all_free


async def test_a_front_end_the_core_took_for_gone_ends_its_requests(
    tiny_llama: tuple[Path, Any], tmp_path: Path
) -> None:
    """The core drops a front end it has not heard from in time (a stopped process) and
    aborts its requests; when that front end is heard again the core welcomes it anew. The
    front end then ends those requests with an error (they used to wait for ever) and serves
    new ones."""
    address = f"ipc://{tmp_path}/core"
    params = aserve.SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    async with (
        aserve.Engine(model=str(tiny_llama[0]), warmup=False) as engine,
        CoreService(engine, address).running() as core,
        EngineClient(address, name="fe-a") as client,
    ):
        with anyio.fail_after(60):
            await client.service_ready.wait()
            stream = client.open_stream([1, 5, 9], params)
            await stream.admitted()
            core.drop(b"fe-a")  # what the core's status loop does after FRONT_END_TIMEOUT_S of silence
            with pytest.raises(aserve.RequestAbortedError, match="took this front end for gone"):
                async for _ in stream:
                    pass
            ok = await client.complete([1, 5, 9], aserve.SamplingParams(max_tokens=4, temperature=0))
            assert len(ok.token_ids) == 4 and not client.live
