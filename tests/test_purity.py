"""The policy is pure: scheduling, request state, the KV allocators, the radix tree, the
sampling parameters, the outputs and the replica routing policies import neither torch nor
anyio (nor the engine, nor Ray), so they
can be read, tested and reasoned about without a device, a model or an event loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PURE = [
    "aserve.scheduler.policy",
    "aserve.scheduler.plan",
    "aserve.scheduler.lpm",
    "aserve.scheduler.req",
    "aserve.scheduler.prefix",
    "aserve.scheduler.sizing",
    "aserve.kv.allocator",
    "aserve.kv.radix",
    "aserve.sampling_params",
    "aserve.outputs",
    "aserve.errors",
    "aserve.routing.prefix",  # the replica router's policies: shared by Ray Serve and the simulator
    "aserve.routing.policy",
]
BLOCKED = ["torch", "anyio", "numpy", "aserve.engine", "aserve.device", "ray"]


def test_policy_modules_import_without_torch_anyio_or_the_engine() -> None:
    script = textwrap.dedent(
        f"""
        import importlib, importlib.abc, sys

        BLOCKED = {BLOCKED!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"pure module imported {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        for mod in {PURE!r}:
            importlib.import_module(mod)
        import aserve
        assert "aserve.engine" not in sys.modules
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_blocker_would_catch_an_impure_module() -> None:
    """The same check fails for a module that does import torch (the test can fail)."""
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError(name)

        sys.meta_path.insert(0, Block())
        import aserve.kv.pool
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "ImportError" in proc.stderr
