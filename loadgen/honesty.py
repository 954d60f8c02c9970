"""Is the client keeping up? Event-loop lag and send-schedule lag, and the warnings of a run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.records import RequestRecord
from loadgen.stats import describe

# Beyond these the client's own timestamps are late by as much as the latencies we measure
# on fast servers, so its numbers describe the client, not the server.
LOOP_LAG_WARN_S = 0.02
SEND_LAG_WARN_S = 0.02


def client_view(records: Sequence[RequestRecord], loop_lags: Sequence[tuple[float, float]]) -> dict[str, Any]:
    loop = describe([lag for _, lag in loop_lags])
    send = describe([x for r in records if (x := r.send_lag) is not None])
    bottleneck = bool(
        (loop["p99"] is not None and float(loop["p99"]) > LOOP_LAG_WARN_S)
        or (send["p99"] is not None and float(send["p99"]) > SEND_LAG_WARN_S)
    )
    return {"loop_lag_s": loop, "send_lag_s": send, "client_bottleneck": bottleneck}


def warnings(summary: dict[str, Any]) -> list[str]:
    out = []
    stopped = summary.get("run", {}).get("stopped_at_s")
    if stopped is not None:
        out.append(
            f"stopped early at t={stopped:.1f}s (a signal): requests in flight were cancelled, listed as unfinished"
        )
    client = summary.get("client", {})
    if client.get("client_bottleneck"):
        out.append(
            "the client may be the bottleneck: event-loop lag p99 "
            f"{_ms(client['loop_lag_s'].get('p99'))}, send lag p99 {_ms(client['send_lag_s'].get('p99'))} "
            f"(warning above {LOOP_LAG_WARN_S * 1000:g} ms); latencies include client delay"
        )
    check = summary.get("token_check", {})
    if check.get("output_len_vs_asked_mismatch"):
        n = len(check["output_len_vs_asked_mismatch"])
        out.append(f"{n} requests returned a different number of tokens than asked (ignore_eos off or a cap?)")
    if check.get("usage_vs_counted_mismatch"):
        n = len(check["usage_vs_counted_mismatch"])
        out.append(
            f"{n} requests: server usage differs from tokens counted in the stream "
            f"(counted by {check.get('count_sources')}); usage is used"
        )
    if check.get("prompt_len_mismatch"):
        out.append(f"{len(check['prompt_len_mismatch'])} requests: server prompt_tokens differ from the prompt built")
    req = summary.get("requests", {})
    if req.get("unfinished"):
        out.append(f"{len(req['unfinished'])} requests never finished: {req['unfinished'][:20]}")
    if req.get("failed"):
        out.append(f"{req['failed']} requests failed: {summary['failures']['by_type']}")
    return out


def _ms(x: Any) -> str:
    return "n/a" if x is None else f"{float(x) * 1000:.1f} ms"
