"""Builds ``growmem._native``, the fused CPU retrieval kernel (``csrc/``: XLA FFI targets that
``growmem.native`` registers), against the FFI headers jax ships (``jax.ffi.include_dir()``, hence
jax among the build requirements). Every other setting of the package is in pyproject.toml.

The build needs only a C++17 compiler (gcc >= 9, clang >= 10): each instruction set's bodies are
compiled for that set by a ``#pragma GCC target`` in their own file (``csrc/isa_*.cc``) and chosen
at run time from what the CPU has, so one build runs on any x86-64 (AVX-512, AVX2 + FMA, or the
portable bodies) and elsewhere (the portable bodies).

The extension is optional: where it cannot be built (no C++ compiler on PATH, say) the install
still succeeds, without it, and growmem runs on the pure-JAX path of growmem.kernels (saying so once,
at the first retrieval: growmem.native).
"""
import jax.ffi
from setuptools import Extension, setup

SOURCES = ["csrc/growmem_native.cc", "csrc/isa_avx512.cc", "csrc/isa_avx2.cc", "csrc/isa_generic.cc"]

setup(ext_modules=[Extension(
    "growmem._native",
    sources=SOURCES,
    depends=["csrc/isa.h", "csrc/reduce_impl.h", "csrc/exp_poly.h"],
    include_dirs=["csrc"],
    # the FFI headers as system headers: their warnings are not ours
    extra_compile_args=["-std=c++17", "-O3", "-fvisibility=hidden", "-Wall", "-Wno-psabi",
                        "-isystem", jax.ffi.include_dir()],
    language="c++",
    optional=True,
)])
