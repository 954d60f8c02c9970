"""Builds aserve's two C extensions, both optional: where no C compiler is found (or a build
fails) the install still succeeds and aserve runs without it (and says so at start-up).

* aserve/kernels/_ggufmm.c: the CPU matmul on GGUF blocks and the CPU step's small ops; without
  it the CPU path runs the dequantized float32 weights;
* aserve/sampling/_grammar_tokens.c: the grammar engine's tokenizer callback in C; without it
  llguidance calls back into Python and a step's masks are filled one by one.

Everything else is in pyproject.toml.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers
            print(f"aserve: skipped the C extensions ({exc}); aserve runs without them", file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"aserve: could not build {ext.name} ({exc}); aserve runs without it", file=sys.stderr)


ggufmm = Extension(
    "aserve.kernels._ggufmm",
    sources=["aserve/kernels/_ggufmm.c"],
    depends=["aserve/kernels/_ggufmm_kernels.h", "aserve/kernels/_cpu_ops.h"],
    extra_compile_args=["-O3", "-pthread", "-std=gnu11", "-Wno-psabi"],
    extra_link_args=["-pthread"],
    libraries=["m"],  # fmaf
    optional=True,
)

grammar_tokens = Extension(
    "aserve.sampling._grammar_tokens",
    sources=["aserve/sampling/_grammar_tokens.c"],
    extra_compile_args=["-O2", "-pthread", "-std=gnu11"],
    extra_link_args=["-pthread"],
    optional=True,
)

setup(ext_modules=[ggufmm, grammar_tokens], cmdclass={"build_ext": OptionalBuildExt})
