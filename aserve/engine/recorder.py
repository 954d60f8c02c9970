"""Per-step accounting after each commit: device busy and idle time, host time per phase,
and the Perfetto trace of each step's token states on the host and device tracks."""

from __future__ import annotations

from collections.abc import Callable

from aserve.device.events import DeviceEvent
from aserve.device.step import Step
from aserve.engine.pipeline import PipelineSlots
from aserve.kv.allocator import LedgerView
from aserve.scheduler.policy import Scheduler
from aserve.stats import EngineStats, StepRecord, StepStats, TraceWriter


class StepRecorder:
    def __init__(self, trace: TraceWriter | None, device_clock: Callable[[DeviceEvent], float]) -> None:
        self.stats = StepStats()
        self.trace = trace
        # Host-clock time at which the device passed an event (CUDA: from timing events).
        self.device_clock = device_clock
        self._prev_end: DeviceEvent | None = None  # the event that ended the previous step

    def record(self, step: Step, commit_s: float, commit_t0: float, resumed: tuple[float, float] | None = None) -> None:
        """``resumed``: a commit that yielded between its two parts (the early sampler) — when
        its first part ended and when its second began (host perf_counter); ``commit_s`` is
        the two parts' time."""
        begin, end = step.forward_begin, step.materialized
        busy = _elapsed(begin, end)
        gap = None
        if self._prev_end is not None and not step.after_idle:
            gap = _elapsed(self._prev_end, begin)
        self._prev_end = end
        if step.split_gap is not None:
            # A split step: the device waited between its forward and its sampler.
            waited = _elapsed(*step.split_gap)
            busy -= waited
            gap = (gap or 0.0) + waited
        self.stats.add(
            StepRecord(
                index=step.index,
                num_seqs=step.num_seqs,
                num_tokens=step.num_tokens,
                num_decodes=step.num_decodes,
                depth_in_use=step.depth_in_use,
                device_busy_s=busy,
                device_gap_s=gap,
                plan_s=step.plan_s,
                launch_s=step.launch_s,
                commit_s=commit_s,
            )
        )
        if self.trace is not None:
            self._trace(step, commit_s, commit_t0, resumed)

    def engine_stats(
        self, sched: Scheduler, ledger: LedgerView, slots: PipelineSlots, output_tokens: int, *,
        finished: int, aborted: int, prompt_tokens: int,
    ) -> EngineStats:  # fmt: skip
        """The engine's counters and gauges now (``Engine.stats``)."""
        st, prefix, ps = self.stats, sched.prefix, ledger.page_size
        return EngineStats(
            running=sum(1 for r in sched.running if not r.finished),
            waiting=len(sched.waiting),
            kv_total_tokens=ledger.total_pages * ps,
            kv_free_tokens=ledger.free_pages * ps,
            kv_used_tokens=ledger.in_use_pages * ps,
            kv_ledger_balanced=ledger.balanced,
            rows_total=ledger.total_rows,
            rows_free=ledger.free_rows,
            pipeline_depth=slots.depth,
            pipeline_in_use=slots.in_use,
            num_steps=st.num_steps,
            num_retractions=sched.num_retractions,
            requests_finished=finished,
            requests_aborted=aborted,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            device_busy_s=st.device_busy_s,
            device_gap_s=st.device_gap_s,
            host_plan_s=st.plan_s,
            host_launch_s=st.launch_s,
            host_commit_s=st.commit_s,
            median_device_gap_s=st.median_gap(),
            median_decode_gap_s=st.median_gap(decode_only=True),
            cache_hit_tokens=prefix.hit_tokens,
            cache_queried_tokens=prefix.queried_tokens,
            cached_tokens=prefix.num_cached_pages * ps,
            cache_evicted_tokens=prefix.tree.num_evicted_pages * ps,
            prefill_tokens_computed=sched.prefill_tokens_computed,
        )

    def _trace(self, step: Step, commit_s: float, commit_t0: float, resumed: tuple[float, float] | None) -> None:
        tr, i = self.trace, step.index
        assert tr is not None
        # A step planned while a split step's sampler waited was planned (and its inputs built)
        # before its launch began; the others right before it.
        planned_end = step.planned.host_time or step.launch_time
        plan_t0 = planned_end - step.plan_s
        commit_end = commit_t0 + commit_s
        parts = [(commit_t0, commit_end)]
        if resumed is not None:  # the two parts, and the yield between them left out
            first_end, second_t0 = resumed
            commit_end = second_t0 + commit_s - (first_end - commit_t0)
            parts = [(commit_t0, first_end), (second_t0, commit_end)]
        tr.span("plan", tr.HOST, plan_t0, planned_end, step=i)
        if step.prepare_s:
            tr.span("prepare", tr.HOST, planned_end, planned_end + step.prepare_s, step=i)
        tr.span("launch", tr.HOST, step.launch_time, step.launch_time + step.launch_s - step.prepare_s, step=i)
        for t0, t1 in parts:
            tr.span("commit", tr.HOST, t0, t1, step=i)
        dev_begin, dev_end = self.device_clock(step.forward_begin), self.device_clock(step.materialized)
        tr.span(f"step {i}", tr.DEVICE, dev_begin, dev_end, seqs=step.num_seqs, tokens=step.num_tokens)
        # The four states: planned while the host builds it, in flight from launch until the
        # device materialized its tokens, materialized until the commit took them.
        tr.state_span("planned", i, plan_t0, step.launch_time)
        tr.state_span("in-flight", i, step.launch_time, dev_end)
        tr.state_span("materialized", i, dev_end, commit_t0)
        tr.state_span("committed", i, commit_end, commit_end)


def _elapsed(a: DeviceEvent, b: DeviceEvent) -> float:
    """Seconds from ``a`` to ``b`` on the device (CUDA timing events) or the host clock."""
    if a.cuda_event is not None and b.cuda_event is not None:
        return max(0.0, a.cuda_event.elapsed_time(b.cuda_event) / 1e3)
    return max(0.0, b.host_time - a.host_time)
