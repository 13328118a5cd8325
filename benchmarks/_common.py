"""Shared helpers for the benchmarks: presets/CLI, interleaved timing, results files.

Every benchmark writes ``<out>/<name>.json`` whose top-level ``summary`` object holds
its headline figures (plus the full data beside it) and a PNG plot ``<out>/<name>.png``.
``<out>`` defaults to ``benchmarks/results``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from growmem import reporting

#: default output folder: benchmarks/results next to this file
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parser(description: str, presets: Mapping[str, Any], default: str = "cpu") -> argparse.ArgumentParser:
    """An ``argparse`` parser with ``--preset {names}`` and ``--out DIR`` (add your own flags)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", choices=sorted(presets), default=default,
                   help="smoke: seconds (run by the tests); cpu: the full grid (minutes); paper: as cpu or larger")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"output folder (default {RESULTS_DIR})")
    return p


def block(x):
    """``jax.block_until_ready`` on any pytree (returns it)."""
    import jax
    return jax.block_until_ready(x)


def time_interleaved(fns: Mapping[str, Callable[[], Any]], repeats: int, *, warmup: int = 1,
                     min_time: float = 0.0, max_repeats: Optional[int] = None,
                     progress: Optional[Callable[[], None]] = None) -> Dict[str, List[float]]:
    """Wall-clock seconds of each zero-argument ``fns[name]()`` (blocked until ready).

    Runs every function ``warmup`` times (compilation, first-touch), then ``repeats``
    rounds, and more rounds while less than ``min_time`` seconds have passed (up to
    ``max_repeats`` rounds in all). Within a round every function runs once, the order
    rotating from round to round, so the baseline and the subjects see the same machine
    load. Returns ``{name: [seconds per round]}``; take :func:`median` of each, or
    :func:`paired_ratio` of two. ``progress()`` is called after each of the first
    ``repeats`` rounds (e.g. a tqdm ``update``).
    """
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            block(fns[n]())
    out = {n: [] for n in names}
    t_start = time.perf_counter()
    max_repeats = repeats if max_repeats is None else max(repeats, max_repeats)
    r = 0
    while r < repeats or (r < max_repeats and time.perf_counter() - t_start < min_time):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            block(fns[n]())
            out[n].append(time.perf_counter() - t0)
        if progress is not None and r < repeats:
            progress()
        r += 1
    return out


def stale_point(r, digest) -> bool:
    """A tuning point run on another version of its method's preset file (recorded digest not ``digest``)."""
    return r.get("preset_digest") is not None and r.get("preset_digest") != digest


def newer_point(r, old, digest) -> bool:
    """Whether tuning point ``r`` replaces ``old`` (the same settings) when tuning files combine: a point of the
    method's preset file as it is now (``digest``) over one recorded before points named their preset's digest,
    that over a stale one; then the later run (``ran_at``; a point without it is older than one with it); at a
    tie the later file's. A copy of an old tuning file, combined after a grid was rerun, cannot bring the old
    numbers back (benchmarks/continual_tune.py and continual_frontier.py's tuner)."""
    def rank(p):
        return (0 if stale_point(p, digest) else 2 if p.get("preset_digest") == digest else 1, p.get("ran_at") or "")
    return rank(r) >= rank(old)


def flat_settings(settings: dict) -> dict:
    """A continual method's settings as one flat dict: its top-level settings and its preset ``overrides``."""
    return {**{k: v for k, v in settings.items() if k != "overrides"}, **settings.get("overrides", {})}


def median(xs) -> float:
    return float(statistics.median(xs))


def paired_ratio(times: Mapping[str, List[float]], base: str, subject: str) -> float:
    """Median over rounds of ``t_base / t_subject`` measured in the same round.

    Pairing calls that ran seconds apart cancels most of the drift in machine load that
    a ratio of two medians keeps, so it is the steadier speed ratio on a shared machine.
    """
    return median([b / s for b, s in zip(times[base], times[subject])])


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the exponent of a power law)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def write_results(name: str, summary: Mapping[str, Any], data: Mapping[str, Any], out_dir=RESULTS_DIR) -> Path:
    """Write ``<out_dir>/<name>.json``: ``{"name", "summary", "environment", **data}``.

    Numpy scalars/arrays are converted; non-finite floats become ``null``.
    """
    doc = {"name": name, "summary": dict(summary), **data}
    return reporting.write_json(Path(out_dir) / f"{name}.json", doc)


def save_figure(fig, name: str, out_dir=RESULTS_DIR) -> Path:
    """Save a matplotlib figure as ``<out_dir>/<name>.png`` and close it."""
    import matplotlib.pyplot as plt
    path = reporting.save_figure(fig, Path(out_dir) / f"{name}.png")
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- storage benchmarks

GB = 1 << 30


def peak_rss_gb() -> float:
    """Peak RSS of this process in GiB: ``VmHWM`` (the high-water mark of this process image).

    Not ``getrusage(...).ru_maxrss``: on Linux that folds in the high-water mark of the
    image replaced by ``exec``, i.e. the forking parent's RSS at fork time, so a benchmark
    started by a large parent (pytest) would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0: ``5`` into ``/proc/self/clear_refs``), so
    :func:`peak_rss_gb` then measures one phase; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5\n")
        return True
    except OSError:
        return False


def raw_read_direct(files, threads: int = 4):
    """``(bytes, seconds)`` of reading ``files`` the way the tier does (:func:`read_chunk_file`),
    ``threads`` files in flight: with the page cache dropped first, every byte comes with
    ``O_DIRECT`` (no page cache, no copy out of it) — what the disk gives when the reader takes
    no CPU. Files on a file system without ``O_DIRECT`` are read through the page cache."""
    import concurrent.futures
    from growmem.backends.tier_files import read_chunk_file

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        total = sum(len(b) for b in pool.map(lambda p: read_chunk_file(str(p), os.path.getsize(p)), files))
    return total, time.perf_counter() - t0


def raw_read(files, buf_mb: int = 16):
    """``(bytes, seconds)`` of reading ``files`` sequentially with plain unbuffered reads."""
    buf = bytearray(buf_mb << 20)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    return total, time.perf_counter() - t0
