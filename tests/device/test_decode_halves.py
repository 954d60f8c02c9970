"""A decode graph split into two half batches (``Halves``) computes, row for row, what the
model computes on each half alone: the same logits bit for bit, the same greedy tokens in the
FutureMap and the same K/V in the cache, over several steps (on a CPU the body runs on the
static buffers with Triton's interpreter; on CUDA the halves run on two streams inside one
captured graph, their attention in turns or free)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aserve.device.decode_graphs import DecodeGraphs, Halves, halves_from_env
from aserve.device.future_map import FutureMap
from aserve.kv.pool import KVPool
from aserve.models.layers import set_fused_ops
from aserve.models.loader import load_model
from tests.tiny import make_tiny_model

_DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]
_ROWS, _CONTEXT = 10, 64


def _graphs(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, halves: Halves | None) -> DecodeGraphs:
    pool = KVPool(model.config, num_pages=_ROWS * _CONTEXT // 16, page_size=16, num_rows=_ROWS, max_context=_CONTEXT,
                  dtype=dtype, device=device)  # fmt: skip
    fmap = FutureMap(_ROWS + 1, device, debug=False)
    graphs = DecodeGraphs(model, pool, fmap, device, 8, halves=halves)
    if device.type == "cuda":
        graphs.capture(torch.cuda.Stream(device))
    return graphs


def _step(graphs: DecodeGraphs, rows: list[int], positions: list[int]) -> torch.Tensor:
    slots = [r * _CONTEXT + p for r, p in zip(rows, positions, strict=True)]
    flat = graphs.host_inputs(rows, positions, slots)
    assert flat is not None
    inputs = torch.tensor(flat, dtype=torch.int64).view(3, -1).to(graphs.device)
    return graphs.run(inputs).logits[: len(rows)].clone()


@pytest.mark.parametrize("device_name", _DEVICES)
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("turns", [True, False])
def test_halves_compute_each_half_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device_name: str, kind: str, turns: bool
) -> None:
    split_sizes: list[int] = []  # the sizes whose body ran as halves (CUDA: at capture only)
    halves_forward = DecodeGraphs._halves_forward

    def spy(self: DecodeGraphs, input_ids: torch.Tensor, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        split_sizes.append(input_ids.shape[0])
        return halves_forward(self, input_ids, *args)

    monkeypatch.setattr(DecodeGraphs, "_halves_forward", spy)
    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    path, _ = make_tiny_model(kind, tmp_path)
    _, model, _ = load_model(str(path), dtype, device)
    set_fused_ops(model, True)
    split = _graphs(model, device, dtype, Halves(min_size=8, turns=turns))
    alone = _graphs(model, device, dtype, None)
    g = torch.Generator().manual_seed(1)
    first = torch.randint(2, model.config.vocab_size, (_ROWS,), generator=g)
    for graphs in (split, alone):
        graphs.future_map.tokens[:_ROWS] = first.to(device)
    # Seven rows pad to the 8-row graph, split 4 + 4 (the second half holds the padding row);
    # the rows start at different positions (earlier keys are the cache's zeros in both).
    rows = [9, 2, 5, 0, 7, 3, 1]
    start = [0, 5, 1, 17, 3, 8, 2]
    for k in range(6):
        positions = [p + k for p in start]
        got = _step(split, rows, positions)
        want = torch.cat([_step(alone, rows[:4], positions[:4]), _step(alone, rows[4:], positions[4:])])
        assert got.dtype == want.dtype == model.logits_dtype(head_dtype=True)
        assert torch.equal(got, want), (k, (got - want).abs().max())
        index = torch.tensor(rows, device=device)
        assert torch.equal(split.future_map.tokens[index], alone.future_map.tokens[index])
        assert torch.equal(split.future_map.tokens[index], want.argmax(dim=-1))
    for (ks, vs), (ka, va) in zip(split.pool.kv_cache, alone.pool.kv_cache, strict=True):
        assert torch.equal(ks, ka) and torch.equal(vs, va)
    assert split.runs == 6 and alone.runs == 12
    assert split_sizes and set(split_sizes) == {8}, split_sizes


def test_halves_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for spec, want in [("", None), ("0", None), ("turns", Halves(128, True)), ("free:64", Halves(64, False))]:
        monkeypatch.setenv("ASERVE_DECODE_HALVES", spec)
        assert halves_from_env() == want
    monkeypatch.setenv("ASERVE_DECODE_HALVES", "both")
    with pytest.raises(ValueError, match="ASERVE_DECODE_HALVES"):
        halves_from_env()
