"""One HTTP front end's capacity: the SSE events a second it delivers and its CPU per event.

    python -m aserve.bench.front_end [--streams 64,256] [--step-ms 2] [--tokens 128] [--client-procs 1]

The front end is the real one: ``aserve serve --api-workers``'s worker (the Starlette app on
Hypercorn, ``EngineClient`` over ZeroMQ), spawned as the launcher spawns it. The engine core
is replaced by a paced core in this process that speaks the same messages (``Welcome``,
``Status``, ``Accepted``, and every ``--step-ms`` one ``Outputs`` with one token for each live
choice, ending each at its ``max_tokens``), so what is measured is the front end's own work per
token: the message, the output cells, detokenization, rendering, SSE over HTTP. The client is
loadgen (``--return-token-ids``). For each stream count: events delivered a second, the front
end's CPU seconds per event and its share of a core, and the client's loop lag. Prints a
table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from aserve.bench.served import _model_path, _ms, _port, bench_parser
from aserve.ipc import messages as m
from aserve.stats import EngineStats

# Words the paced core sends, cycled: real tokens, so detokenization does real work.
_WORDS = " the quick brown fox jumps over a lazy dog and runs far away"


def _zero_stats() -> dict[str, Any]:
    return EngineStats(0, 0, 1, 1, 0, True, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, None, None).as_dict()


@dataclass
class _Choices:
    left: list[int]  # tokens still to send, per choice
    total: int  # max_tokens


@dataclass
class PacedCore:
    """A stand-in engine core for measuring front ends: every ``step_s`` each front end gets one
    ``Outputs`` with one token for every live choice (as the real core sends one per step)."""

    address: str
    model_path: str
    vocab_size: int
    tokens: list[int]
    step_s: float
    sent_tokens: int = 0
    live: dict[bytes, dict[str, _Choices]] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(self.address)
        tasks = [asyncio.create_task(f(sock)) for f in (self._receive, self._steps, self._status)]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sock.close(linger=0)
            ctx.term()

    async def _send(self, sock: zmq.asyncio.Socket, identity: bytes, msg: m.ToFrontEnd) -> None:
        await sock.send_multipart([identity, m.encode(msg)])

    async def _receive(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            identity, data = await sock.recv_multipart()
            msg = m.decode_to_core(data)
            if identity not in self.live:
                self.live[identity] = {}
                welcome = m.Welcome(model="paced", model_path=self.model_path, vocab_size=self.vocab_size,
                                    max_context=1 << 16, kv_tokens=1 << 24, eos_token_ids=[1],
                                    max_waiting_requests=1 << 16, info={})  # fmt: skip
                await self._send(sock, identity, welcome)
            if isinstance(msg, m.Hello):
                await self._send(sock, identity, m.Status(ready=True, stats=_zero_stats()))
            elif isinstance(msg, m.Add):
                max_tokens = msg.params.max_tokens or 16
                self.live[identity][msg.rid] = _Choices([max_tokens] * len(msg.seeds), max_tokens)
                await self._send(sock, identity, m.Accepted(msg.rid))
            elif isinstance(msg, m.Abort):
                for rid in msg.rids:
                    self.live[identity].pop(rid, None)
            elif isinstance(msg, m.Query):
                await self._send(sock, identity, m.Reply(msg.qid, _zero_stats() if msg.what == "stats" else 0))
            elif isinstance(msg, m.Bye):
                self.live.pop(identity, None)

    async def _steps(self, sock: zmq.asyncio.Socket) -> None:
        step = 0
        while True:
            await asyncio.sleep(self.step_s)
            token = self.tokens[step % len(self.tokens)]
            step += 1
            for identity, reqs in list(self.live.items()):
                # As the core: a choice's first token and its last as items, the rest in columns.
                items: list[m.Output] = []
                rids: list[str] = []
                indexes: list[int] = []
                for rid, choices in list(reqs.items()):
                    for index, left in enumerate(choices.left):
                        if left <= 0:
                            continue
                        choices.left[index] = left - 1
                        if left == 1 or left == choices.total:
                            items.append(m.Output(rid, index, [token], "length" if left == 1 else None))
                        else:
                            rids.append(rid)
                            indexes.append(index)
                    if not any(choices.left):
                        del reqs[rid]
                if items or rids:
                    self.sent_tokens += len(items) + len(rids)
                    ones = [1] * len(rids)
                    await self._send(sock, identity, m.Outputs(items, rids, indexes, ones, [token] * len(rids),
                                                               [0] * len(rids)))  # fmt: skip

    async def _status(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            await asyncio.sleep(0.25)
            for identity in list(self.live):
                await self._send(sock, identity, m.Status(ready=True, stats=_zero_stats()))


def _spawn_front_end(model_path: str, port: int, core_address: str) -> Any:
    from aserve.config import EngineConfig
    from aserve.ipc.launcher import FrontEndSpec, run_front_end
    from aserve.server.limits import BodyLimits
    from aserve.server.serve import hypercorn_config

    sockets = hypercorn_config("127.0.0.1", port).create_sockets()
    spec = FrontEndSpec(EngineConfig(model=model_path, device="cpu"), "127.0.0.1", port, None, "bench",
                        BodyLimits(), 5.0, core_address, "json")  # fmt: skip
    proc = multiprocessing.get_context("spawn").Process(target=run_front_end, args=(spec, sockets), name="fe-bench")
    proc.start()
    return proc, sockets


async def _ready(base: str, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(base + "/health", timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the front end did not become ready")
            await asyncio.sleep(0.2)


async def _measure(a: argparse.Namespace, path: Path, work: Path) -> dict[str, Any]:
    from aserve.engine.setup import load_tokenizer

    tok = load_tokenizer(path)
    # The front end inherits this (as the launcher's front ends do); it is put back after, so a
    # caller in the same process (a test run) is not left pointing at a deleted directory.
    saved = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    try:
        with tempfile.TemporaryDirectory(prefix="aserve-fe-bench-") as tmp:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tmp
            return await _measure_in(a, path, work, tok, tmp)
    finally:
        if saved is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved


async def _measure_in(a: argparse.Namespace, path: Path, work: Path, tok: Any, tmp: str) -> dict[str, Any]:
    from loadgen.procstat import cpu_seconds

    tokens = tok.encode(_WORDS, add_special_tokens=False)
    core = PacedCore(f"ipc://{tmp}/core", str(path), tok.vocab_size, tokens, a.step_ms / 1e3)
    stop = asyncio.Event()
    core_task = asyncio.create_task(core.run(stop))
    port = _port()
    proc, sockets = _spawn_front_end(str(path), port, core.address)
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        await _ready(base)
        for streams in (int(s) for s in a.streams.split(",")):
            label = f"fe_s{streams}"
            cmd = [sys.executable, "-m", "loadgen", "run", "--base-url", base, "--model", "bench",
                   "--workload", "random", "--num-requests", str(streams * a.waves), "--input-len", "16",
                   "--output-len", str(a.tokens), "--seed", "1", "--tokenizer", str(path), "--rate", "inf",
                   "--max-concurrency", str(streams), "--client-procs", str(a.client_procs),
                   "--return-token-ids", "--no-progress", "--no-plots", "--out", str(work), "--label", label]  # fmt: skip
            cpu0, sent0 = cpu_seconds(proc.pid) or 0.0, core.sent_tokens
            await asyncio.to_thread(subprocess.run, cmd, check=True, timeout=1200, stdout=subprocess.DEVNULL)
            cpu = (cpu_seconds(proc.pid) or 0.0) - cpu0
            s = json.loads((work / f"{label}.json").read_text())
            events = core.sent_tokens - sent0
            wall = s["run"]["wall_s"]
            row = {
                "streams": streams,
                "offered_events_per_s": streams / (a.step_ms / 1e3),
                "delivered_tok_s": s["throughput"]["output_tok_per_s"],
                "events": events,
                "front_end_cpu_s": cpu,
                "front_end_us_per_event": cpu / max(events, 1) * 1e6,
                "front_end_busy": cpu / wall,
                "client_loop_lag_p99_ms": s["client"]["loop_lag_s"]["p99"] * 1e3,
                "itl_p99_ms": _ms(s["latency_s"]["itl"]["p99"]),
                "itl_max_ms": _ms(s["latency_s"]["itl"]["max"]),
                "failed": s["requests"]["failed"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.join(30)
        for sock in sockets.insecure_sockets:
            sock.close()
        stop.set()
        await core_task
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(), "cpus": os.cpu_count(),
            "step_ms": a.step_ms, "tokens": a.tokens, "client_procs": a.client_procs, "rows": rows}  # fmt: skip


def main() -> int:
    ap = bench_parser(__doc__, "front_end.json", "tiny Gemma 3; only its tokenizer is used")
    ap.add_argument("--streams", default="16,64")
    ap.add_argument("--step-ms", type=float, default=2.0, help="the paced core's step: one token a stream per step")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens a request")
    ap.add_argument("--waves", type=int, default=2, help="requests = streams x waves")
    ap.add_argument("--client-procs", type=int, default=1)
    a = ap.parse_args()
    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    path = _model_path(a.model, work, a.tokenizer_dir, "tiny-gemma3")
    result = asyncio.run(_measure(a, path, work / "front-end-runs"))
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"\n{'streams':>8} {'offered ev/s':>13} {'delivered tok/s':>16} {'FE us/event':>12} {'FE busy':>8} "
          f"{'client lag p99':>15} {'ITL p99/max':>14} {'failed':>7}")  # fmt: skip
    for r in result["rows"]:
        print(f"{r['streams']:>8} {r['offered_events_per_s']:>13,.0f} {r['delivered_tok_s']:>16,.0f} "
              f"{r['front_end_us_per_event']:>12.1f} {100 * r['front_end_busy']:>7.0f}% "
              f"{r['client_loop_lag_p99_ms']:>13.1f}ms {r['itl_p99_ms']:>6.1f}/{r['itl_max_ms']:<5.0f}ms {r['failed']:>7}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
