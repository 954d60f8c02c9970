"""Builds aserve's one C extension, the CPU matmul on GGUF blocks (aserve/kernels/_ggufmm.c).

It is optional: where no C compiler is found (or the build fails) the install still succeeds
and the CPU path runs the dequantized float32 weights instead (aserve says so at start-up).
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
            print(f"aserve: skipped the GGUF CPU kernel ({exc}); the CPU path will use float32", file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"aserve: could not build {ext.name} ({exc}); the CPU path will use float32", file=sys.stderr)


ggufmm = Extension(
    "aserve.kernels._ggufmm",
    sources=["aserve/kernels/_ggufmm.c"],
    depends=["aserve/kernels/_ggufmm_kernels.h", "aserve/kernels/_cpu_ops.h"],
    extra_compile_args=["-O3", "-pthread", "-std=gnu11", "-Wno-psabi"],
    extra_link_args=["-pthread"],
    libraries=["m"],  # fmaf
    optional=True,
)

setup(ext_modules=[ggufmm], cmdclass={"build_ext": OptionalBuildExt})
