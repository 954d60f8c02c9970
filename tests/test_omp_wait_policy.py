"""Importing aserve sets OpenMP's wait policy to PASSIVE before torch loads its libgomp.

libgomp reads OMP_WAIT_POLICY once, when the library loads (at ``import torch``), so each case
runs in a fresh interpreter; ``OMP_DISPLAY_ENV=VERBOSE`` makes libgomp print the settings it
took, GOMP_SPINCOUNT among them: 0 is PASSIVE (idle threads sleep at once), 300000 the
default (they spin ~3 ms), 30000000000 ACTIVE. That line is libgomp's own, not aserve's
(one per libgomp loaded: sentencepiece's wheel brings a second one, which reads it too).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _libgomp_settings(code: str, **env: str) -> tuple[str, str]:
    """(stdout, the GOMP_SPINCOUNT line every libgomp printed) of ``python -c code``,
    OMP_WAIT_POLICY unset unless given."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", code], env={**base, "OMP_DISPLAY_ENV": "VERBOSE", **env}, cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    spin = {line.strip() for line in r.stderr.splitlines() if "GOMP_SPINCOUNT" in line}
    assert len(spin) == 1, r.stderr  # at least one libgomp printed, and all took the same
    return r.stdout.strip(), spin.pop()


def test_import_aserve_makes_torch_openmp_passive() -> None:
    out, spin = _libgomp_settings("import os, aserve, torch; print(os.environ['OMP_WAIT_POLICY'])")
    assert out == "PASSIVE"
    assert spin == "GOMP_SPINCOUNT = '0'"  # libgomp took it: waiting threads sleep


def test_the_cli_entry_sets_it_before_torch() -> None:
    # `aserve ...` runs aserve.cli, a submodule: the package's __init__ runs first.
    out, spin = _libgomp_settings("import aserve.cli, aserve.engine, os; print(os.environ['OMP_WAIT_POLICY'])")
    assert (out, spin) == ("PASSIVE", "GOMP_SPINCOUNT = '0'")


def test_a_policy_the_user_set_is_kept() -> None:
    out, spin = _libgomp_settings("import os, aserve, torch; print(os.environ['OMP_WAIT_POLICY'])",
                                  OMP_WAIT_POLICY="ACTIVE")  # fmt: skip
    assert out == "ACTIVE"
    assert spin == "GOMP_SPINCOUNT = '30000000000'"


def test_torch_imported_first_is_left_alone_and_reported() -> None:
    code = (
        "import os, torch, aserve; from aserve.engine.setup import omp_wait_policy; "
        "print(aserve.TORCH_IMPORTED_FIRST, 'OMP_WAIT_POLICY' in os.environ, omp_wait_policy(), sep='|')"
    )
    out, spin = _libgomp_settings(code)
    first, in_env, reported = out.splitlines()[-1].split("|")
    assert (first, in_env) == ("True", "False")
    assert spin == "GOMP_SPINCOUNT = '300000'"  # libgomp's default, as torch loaded it
    assert "torch was imported before aserve" in reported


def test_the_benchmark_gives_its_peer_the_users_environment() -> None:
    """cpu_bench starts llama.cpp without the PASSIVE that aserve's import added (llama.cpp's
    OpenMP runtime reads the same variable), but keeps a policy the user set."""
    code = "import os, aserve.bench.cpu_bench as c; print(os.environ.get('OMP_WAIT_POLICY'), c.peer_env().get('OMP_WAIT_POLICY'))"
    out, _ = _libgomp_settings(code)
    assert out.splitlines()[-1] == "PASSIVE None"
    out, _ = _libgomp_settings(code, OMP_WAIT_POLICY="ACTIVE")
    assert out.splitlines()[-1] == "ACTIVE ACTIVE"


def test_the_llama_cpp_peer_never_imports_aserve() -> None:
    """llama_peer.py runs by path; importing aserve there would set the policy again."""
    peer = ROOT / "aserve" / "bench" / "llama_peer.py"
    tree = ast.parse(peer.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "aserve" not in imported, imported
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python (the bench extra) is not installed")
    from aserve.bench.cpu_bench import peer_env
    from aserve.models.loader import resolve_model_path

    work = json.dumps({"prompt": "Hello", "long_prompts": [[2, 1000, 1001]]})
    r = subprocess.run([sys.executable, str(peer), str(resolve_model_path("gemma-3-270m")), "1", "3", "2"], input=work,
                       env={**peer_env(), "OMP_DISPLAY_ENV": "VERBOSE"}, capture_output=True, text=True, timeout=300,
                       check=True)  # fmt: skip
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["decode_s"]) == 2 and min(out["decode_s"]) > 0 and len(out["ttft_s"]) == 1
    assert "GOMP_SPINCOUNT = '300000'" in r.stderr  # llama.cpp's libgomp took its own default
