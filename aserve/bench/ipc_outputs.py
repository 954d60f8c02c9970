"""The engine core's per-step cost of telling a front end its choices' new tokens, and the front
end's cost of decoding it: one ``Outputs`` message a step, its next tokens in columns (what the
core sends) against every choice as an ``Output`` item (the form before columns).

    python -m aserve.bench.ipc_outputs [--choices 16,64,256] [--steps 3000] [--out ipc_outputs.json]

Each step pushes one token into every choice's output cell (as the committer does), then times
``collect_outputs`` plus ``encode`` (the core's side, on its loop) and ``decode_to_front_end``
(the front end's). Steady streams only: every choice is past its first token. Prints a table,
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from aserve.engine.cell import OutputCell
from aserve.ipc import messages as m
from aserve.ipc.core import collect_outputs
from aserve.sampling_params import SamplingParams
from aserve.scheduler.req import Req
from aserve.sync import Signal


def _live(choices: int) -> dict[str, dict[int, Req]]:
    signal = Signal()
    params = SamplingParams(max_tokens=1 << 20, ignore_eos=True)
    live: dict[str, dict[int, Req]] = {}
    for i in range(choices):
        req = Req(rid=f"cmpl-{i:032x}", index=0, prompt_ids=[1, 2, 3], params=params, max_new_tokens=1 << 20,
                  seed=0, stop_ids=frozenset())  # fmt: skip
        req.cell = OutputCell(signal)
        live[req.rid] = {0: req}
    return live


def measure(choices: int, steps: int, columns: bool) -> dict[str, Any]:
    live = _live(choices)
    cells = [req.cell for reqs in live.values() for req in reqs.values()]
    for cell in cells:  # every stream is past its first token: its first message went out
        assert cell is not None
        cell.push(7, None)
    collect_outputs(live, columns)
    core_s = fe_s = 0.0
    size = 0
    for step in range(steps):
        for cell in cells:
            assert cell is not None
            cell.push(1000 + step % 500, None)
        t0 = time.perf_counter()
        msg = collect_outputs(live, columns)
        assert msg is not None
        data = m.encode(msg)
        t1 = time.perf_counter()
        m.decode_to_front_end(data)
        t2 = time.perf_counter()
        core_s += t1 - t0
        fe_s += t2 - t1
        size = len(data)
    return {"choices": choices, "form": "columns" if columns else "items", "core_us_per_step": core_s / steps * 1e6,
            "front_end_decode_us_per_step": fe_s / steps * 1e6, "bytes": size}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--choices", default="16,64,256")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", default="ipc_outputs.json")
    a = ap.parse_args()
    rows = [measure(int(c), a.steps, columns) for c in a.choices.split(",") for columns in (False, True)]
    Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                                       "steps": a.steps, "rows": rows}, indent=1))  # fmt: skip
    print(f"{'choices':>8} {'form':>8} {'core us/step':>13} {'FE decode us/step':>18} {'bytes':>7}")
    for r in rows:
        print(f"{r['choices']:>8} {r['form']:>8} {r['core_us_per_step']:>13.1f} "
              f"{r['front_end_decode_us_per_step']:>18.1f} {r['bytes']:>7}")  # fmt: skip


if __name__ == "__main__":
    main()
