"""The ``GROWMEM_*`` environment variables read deep inside a run, parsed in one place (the bottom floor:
imports nothing heavy, so a command checks them at once, before JAX loads)."""
from __future__ import annotations

import os

from .errors import ConfigError

#: the values of ``GROWMEM_KERNELS`` (growmem.native); the first is the default
KERNEL_MODES = ("native", "xla")


def kernel_mode() -> str:
    """``GROWMEM_KERNELS``: ``native`` (default) or ``xla``; another value is a :class:`ConfigError`."""
    value = os.environ.get("GROWMEM_KERNELS", KERNEL_MODES[0]).strip().lower() or KERNEL_MODES[0]
    if value not in KERNEL_MODES:
        raise ConfigError(f"GROWMEM_KERNELS={value!r}: choose one of {KERNEL_MODES} (or leave it unset for "
                          f"{KERNEL_MODES[0]!r})")
    return value


def native_threads() -> int:
    """``GROWMEM_NATIVE_THREADS``: the most threads a native pass uses (0: XLA's pool)."""
    text = os.environ.get("GROWMEM_NATIVE_THREADS", "").strip() or "0"
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"GROWMEM_NATIVE_THREADS={text!r}: give a whole number of threads >= 1 (or 0, or leave it "
                          f"unset, for every thread of XLA's pool)")
    return n


def check() -> None:
    """Every variable above, checked before any work (one line, at once)."""
    kernel_mode()
    native_threads()
