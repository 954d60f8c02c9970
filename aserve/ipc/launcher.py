"""``aserve serve --api-workers N``: the engine core here, N HTTP front ends in worker processes.

The listening socket is made here and inherited by every front end (the kernel spreads the
connections); the core binds a ZeroMQ ROUTER on an ``ipc://`` path in a private directory.
This process supervises: a front end that dies (``kill -9``) has its requests aborted in the
core and is replaced; SIGTERM/SIGINT is passed to every front end, each drains its own
streams (``--shutdown-timeout``) and exits, then the core closes and this process exits 0.
If the engine fails to load or stops after a fault while serving (``Engine.failure``), or the
core itself fails, the front ends are stopped and the exit status is 1; after a fault the
front ends answer 503 ``engine_failed`` (the core tells them at once) until the engine has
closed. If this process is killed outright, the front ends notice the missing heartbeat
within seconds, answer 503 meanwhile, and exit non-zero.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import anyio

from aserve.config import EngineConfig
from aserve.logs import configure_logging, get_logger
from aserve.server.limits import BodyLimits

if TYPE_CHECKING:
    from aserve.engine import Engine

log = get_logger("aserve.launcher")


@dataclass(frozen=True)
class FrontEndSpec:
    config: EngineConfig
    host: str
    port: int
    api_key: str | None
    served_model_name: str
    body: BodyLimits
    shutdown_timeout: float
    core_address: str
    log_format: str


def default_api_workers(config: EngineConfig) -> int:
    """Front-end processes when ``--api-workers`` is not given: with CUDA, one per two spare
    cores up to 8 (the GPU's step is short, the front ends' per-token work is not); on a CPU,
    none (the cores are the engine's: measured in docs/benchmarks.md)."""
    if config.torch_device.type != "cuda":
        return 0
    return max(1, min(8, ((os.cpu_count() or 2) - 2) // 2))


def run_front_end(spec: FrontEndSpec, sockets: Any) -> None:
    """A front-end process: the app on Hypercorn over the inherited sockets, engine over IPC."""
    from aserve.server.serve import serve

    configure_logging(spec.log_format)
    code = asyncio.run(
        serve(
            spec.config,
            host=spec.host,
            port=spec.port,
            api_key=spec.api_key,
            served_model_name=spec.served_model_name,
            body=spec.body,
            shutdown_timeout=spec.shutdown_timeout,
            sockets=sockets,
            core_address=spec.core_address,
        )
    )
    sys.exit(code)


async def serve_with_front_ends(
    config: EngineConfig,
    *,
    workers: int,
    host: str,
    port: int,
    api_key: str | None,
    served_model_name: str,
    body: BodyLimits,
    shutdown_timeout: float,
    log_format: str,
    sockets: Any = None,
) -> int:
    """The engine core here, ``workers`` front ends in their own processes, all on the same
    listening ``sockets`` (bound here when not given)."""
    from aserve.ipc.core import CoreService
    from aserve.server.serve import hypercorn_config

    if sockets is None:
        sockets = hypercorn_config(host, port).create_sockets()
    workdir = tempfile.mkdtemp(prefix="aserve-")
    metrics_dir = os.path.join(workdir, "metrics")
    os.mkdir(metrics_dir)
    # Set before the front ends start (spawned, so they import prometheus-client afresh).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    spec = FrontEndSpec(config, host, port, api_key, served_model_name, body, shutdown_timeout,
                        f"ipc://{workdir}/core", log_format)  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    procs: dict[int, BaseProcess] = {}

    def spawn(i: int) -> None:
        p = ctx.Process(target=run_front_end, args=(spec, sockets), name=f"aserve-api-{i}")
        p.start()
        procs[i] = p

    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    code = 0
    failure: BaseException | None = None
    try:
        for i in range(workers):  # they load their tokenizers while the core loads the model
            spawn(i)
        log.info("serving", host=host, port=port, model=served_model_name, api_workers=workers,
                 auth=api_key is not None)  # fmt: skip
        async with _serving_engine(config) as engine, CoreService(engine, spec.core_address, workers).running() as core:
            log.info("core_ready", address=spec.core_address)
            while not signalled.is_set() and engine.failure is None:
                with anyio.move_on_after(0.2):
                    await signalled.wait()
                for i, p in list(procs.items()):
                    if not p.is_alive() and not signalled.is_set():
                        log.warning("front_end_died", worker=i, pid=p.pid, exitcode=p.exitcode)
                        core.drop(f"fe-{p.pid}".encode())
                        _mark_dead(p)
                        spawn(i)
            failure = engine.failure
            if failure is None:
                log.info("shutdown_requested", api_workers=len(procs))
                code = await _stop_front_ends(procs, shutdown_timeout + 15)
            else:
                # The core told every front end at once (CoreService._failure_loop); they answer
                # 503 engine_failed while the engine closes here, as one process does, and exit
                # once the core's socket closes behind it.
                with anyio.move_on_after(1):
                    await core.failure_told.wait()
                await engine.aclose()
        if failure is not None:
            # Fatal (a device fault, a stall): the front ends lost the core and answer 503
            # while they stop; the process exits 1, as when the engine fails to load.
            raise failure
    except Exception as exc:
        log.error("engine_failed", error=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        await _stop_front_ends(procs, 5)
        code = 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for s in (*sockets.secure_sockets, *sockets.insecure_sockets, *sockets.quic_sockets):
            s.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if code == 0:
        log.info("shutdown_complete")
    return code


@asynccontextmanager
async def _serving_engine(config: EngineConfig) -> AsyncIterator[Engine]:
    """The core's engine, started, with its grammar tokenizer built off its loop (as the
    one-process server does) before the front ends are served."""
    from aserve.engine import Engine

    async with Engine(config) as engine:
        await engine.prepare_structured_outputs()
        yield engine


async def _stop_front_ends(procs: dict[int, BaseProcess], timeout_s: float) -> int:
    """SIGTERM each front end (it drains its streams), wait, then kill what is left. 0 if all exited 0."""
    for p in procs.values():
        if p.is_alive():
            p.terminate()
    with anyio.move_on_after(timeout_s):
        while any(p.is_alive() for p in procs.values()):  # noqa: ASYNC110 - processes have no event to await
            await anyio.sleep(0.05)
    code = 0
    for p in procs.values():
        if p.is_alive():
            p.kill()
            p.join(5)
            code = 1
        elif p.exitcode != 0:
            code = 1
    return code


def _mark_dead(p: BaseProcess) -> None:
    from prometheus_client import multiprocess

    if p.pid is not None:
        multiprocess.mark_process_dead(p.pid)
