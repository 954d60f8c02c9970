"""Which weights the engine runs: the GGUF's blocks on a CPU by default (where the kernel is
built), float32 when asked, and a clear error where ``dtype="gguf"`` cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aserve.config import EngineConfig
from aserve.engine.setup import available_cpus, use_gguf_blocks
from aserve.errors import InvalidRequestError
from aserve.kernels.gguf_linear import kernel
from tests.tiny import make_tiny_model

needs_kernel = pytest.mark.skipif(kernel() is None, reason="GGUF CPU kernel not built")
CPU = torch.device("cpu")


@needs_kernel
def test_cpu_default_for_a_gguf_is_the_blocks() -> None:
    assert use_gguf_blocks(EngineConfig(model="gemma-3-270m"), CPU)
    assert use_gguf_blocks(EngineConfig(model="gemma-3-270m", dtype="gguf"), CPU)
    assert not use_gguf_blocks(EngineConfig(model="gemma-3-270m", dtype="float32"), CPU)
    assert EngineConfig(dtype="gguf").torch_dtype == torch.float32  # activations and KV


def test_gguf_on_a_gpu_is_an_error() -> None:
    assert not use_gguf_blocks(EngineConfig(model="gemma-3-270m"), torch.device("cuda"))
    with pytest.raises(InvalidRequestError, match="runs on a CPU"):
        use_gguf_blocks(EngineConfig(model="gemma-3-270m", dtype="gguf"), torch.device("cuda"))


def test_gguf_for_a_checkpoint_directory_is_an_error(tmp_path: Path) -> None:
    path, _ = make_tiny_model("llama", tmp_path / "tiny")
    assert not use_gguf_blocks(EngineConfig(model=str(path)), CPU)  # the default: float32
    with pytest.raises(InvalidRequestError, match=r"needs a \.gguf model"):
        use_gguf_blocks(EngineConfig(model=str(path), dtype="gguf"), CPU)


def test_unknown_dtype_lists_gguf() -> None:
    with pytest.raises(InvalidRequestError, match="gguf"):
        EngineConfig(dtype="int4")  # type: ignore[arg-type]


def test_available_cpus_is_within_the_machine() -> None:
    assert 1 <= available_cpus() <= (torch.multiprocessing.cpu_count() or 1)
