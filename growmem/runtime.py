"""Process-level settings for long training runs on the CPU.

:func:`keep_freed_memory`: glibc's ``malloc`` hands every freed block above its mmap threshold
(at most 32 MB) back to the kernel and maps it again, zeroed page by page, at the next
allocation. XLA's CPU runtime allocates a step's large outputs and temporaries afresh at every
step, so a step that produces row-sized buffers — the row gradients and Adam moments of a hybrid
layer (Alg. 4), a growing table's next capacity — pays a page fault per 4 KiB page and the
kernel's time to zero it, every step (a hybrid step at ~2,000 rows per layer: 3,000 faults and
12 % system time; with this setting 680 and 2.5 %). The setting asks ``malloc`` to keep freed
memory in the process instead (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, 2 GiB)``):
the process's resident size then stays near its peak rather than shrinking between steps.

The ``growmem train`` and ``growmem repro`` commands and ``benchmarks/single_pass.py`` call it;
``GROWMEM_MALLOC=system`` leaves ``malloc`` as it is. A library user calls it (or not) at the
start of a training script. It does nothing where the C library is not glibc.

:func:`exec_with_huge_pages`: a growing table is first touched page by page when its capacity
grows (the fp32 single pass over MNIST: 145 faults a step, all of them the memory's own new
pages). glibc ≥ 2.35 backs ``malloc``'s memory with 2 MiB transparent huge pages when started
with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (and the kernel's THP mode is ``madvise`` or
``always``): up to 512× fewer faults (that single pass: 10.8 a step against 145, 0.98× the wall
time, measured alone in one session). The
tunable is read only at process start, so the function re-executes the same command line with
it set — the commands above call it first, before any work; a library user sets the variable
in the shell instead (``GROWMEM_MALLOC=system`` opts out of both settings).

:func:`compilation_cache`: JAX's persistent compilation cache for the process, so a program compiled once —
a train step of one shape — is loaded from disk by the next seed, method or process instead of compiled
again (the continual benchmarks call it: the same executable, the same results).

:func:`allgather_json`: small JSON values (row counts, checksums, tier references) exchanged between the
processes of a distributed run — the one way the backends and the checkpointer share host metadata.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from pathlib import Path
from typing import Dict, Optional

#: mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: freed memory kept before malloc trims the heap's top (the largest value mallopt takes)
TRIM_THRESHOLD = 2 ** 31 - 1

_applied: Dict[str, object] = {}


def keep_freed_memory() -> Dict[str, object]:
    """Keep freed blocks in the process (see the module docstring). Idempotent; returns what was
    done: ``{"applied": bool, "reason": str}``."""
    if _applied:
        return dict(_applied)
    if os.environ.get("GROWMEM_MALLOC", "").lower() == "system":
        _applied.update(applied=False, reason="GROWMEM_MALLOC=system")
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _applied.update(applied=False, reason=f"not glibc ({platform.system()} {platform.libc_ver()[0] or '?'})")
    else:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        _applied.update(applied=bool(ok), reason="mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
                        if ok else "mallopt refused")
    return dict(_applied)


#: glibc's tunable for huge-page backed malloc memory (glibc >= 2.35)
HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
#: set in the re-executed process: never re-execute twice
REEXEC_MARK = "GROWMEM_HUGE_PAGES_REEXEC"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_env(env: Optional[Dict[str, str]] = None) -> Optional[Dict[str, str]]:
    """``env`` (default ``os.environ``) with :data:`HUGETLB_TUNABLE` added to ``GLIBC_TUNABLES``
    (other tunables kept), or None where it cannot help or is not wanted: ``GROWMEM_MALLOC=system``,
    not glibc ≥ 2.35, transparent huge pages ``never``, already set, or already re-executed."""
    env = dict(os.environ if env is None else env)
    if env.get("GROWMEM_MALLOC", "").lower() == "system" or env.get(REEXEC_MARK):
        return None
    lib, version = platform.libc_ver()
    try:
        if platform.system() != "Linux" or lib != "glibc" or tuple(int(v) for v in version.split(".")[:2]) < (2, 35):
            return None
    except ValueError:
        return None
    try:
        with open(THP_SETTING) as f:
            if "[never]" in f.read():
                return None
    except OSError:
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None
    env["GLIBC_TUNABLES"] = f"{tunables}:{HUGETLB_TUNABLE}" if tunables else HUGETLB_TUNABLE
    env[REEXEC_MARK] = "1"
    return env


def exec_with_huge_pages() -> None:
    """Re-execute this process's command line (``sys.orig_argv``) with huge-page backed ``malloc``
    (see the module docstring); returns without doing anything where :func:`huge_pages_env` says
    it cannot help. Call it first in a command's ``main``, before any work: the process is
    replaced. Never call it from a library function or a test process."""
    env = huge_pages_env()
    if env is None:
        return
    argv = list(getattr(sys, "orig_argv", []) or [])
    if not argv or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)


#: calls of :func:`allgather_json` in this process: every process makes the same calls in the same order, so
#: the count names one exchange in the coordinator's key-value store
_EXCHANGES = [0]
#: how long a process waits for another's value (a process that died mid-run fails the others past it)
ALLGATHER_TIMEOUT_MS = 10 * 60 * 1000


def allgather_json(value) -> list:
    """``value`` (JSON-able) of every process of a ``jax.distributed`` run, in process order: a collective
    (every process calls it at the same point); ``[value]`` in a single process.

    Through the coordinator's key-value store (``jax.distributed``'s client, as Orbax's own host exchanges),
    not an XLA collective: no program is compiled or launched for a few bytes of metadata."""
    import jax

    if jax.process_count() == 1:
        return [value]
    import json

    from jax._src import distributed   # the client Orbax's multihost utilities use

    client = distributed.global_state.client
    _EXCHANGES[0] += 1
    n, me = _EXCHANGES[0], jax.process_index()
    if n > 2:   # every process has read exchange n - 2 (it set its value of n - 1 after): the store stays small
        client.key_value_delete(f"growmem/allgather/{n - 2}/{me}")
    client.key_value_set(f"growmem/allgather/{n}/{me}", json.dumps(value))
    return [json.loads(client.blocking_key_value_get(f"growmem/allgather/{n}/{i}", ALLGATHER_TIMEOUT_MS))
            for i in range(jax.process_count())]


#: the largest a cache of compiled programs made by :func:`compilation_cache` grows (JAX evicts the least
#: recently used programs past it)
CACHE_BYTES = 2 * 1024 ** 3


def compilation_cache(folder=None, max_bytes: int = CACHE_BYTES) -> Optional[Path]:
    """Turn on JAX's persistent compilation cache in this process; returns its folder (None: off).

    A cache the user set up (``$JAX_COMPILATION_CACHE_DIR`` or ``jax_compilation_cache_dir``) is left as it is
    and returned. Else ``folder``, else ``$GROWMEM_XLA_CACHE``, else ``$XDG_CACHE_HOME/growmem/xla``
    (``~/.cache/growmem/xla``); ``GROWMEM_XLA_CACHE=off`` turns it off. Every compiled program is kept, up to
    ``max_bytes`` (JAX's least-recently-used eviction, under a file lock so processes may share the folder;
    without the ``filelock`` package the cache stays off)."""
    import jax

    own = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if own:
        return Path(own)
    chosen = folder or os.environ.get("GROWMEM_XLA_CACHE")
    if str(chosen).lower() == "off":
        return None
    try:
        import filelock  # noqa: F401  (JAX's eviction locks the folder with it)
    except ImportError:
        return None
    if not chosen:
        chosen = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "growmem" / "xla"
    path = Path(chosen).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    return path
