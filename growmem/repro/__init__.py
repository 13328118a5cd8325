"""The paper's experiments (Sec. 5, App. E, F, G) as runnable reproductions.

    growmem repro --list
    growmem repro NAME --preset smoke|cpu|paper [--out DIR] [--data-dir D] [--download] [--resume]
    growmem repro --table [--out DIR]          # README_TABLE.md from the JSONs in DIR

or from Python: ``growmem.repro.run("single-pass", "smoke", out="/tmp/r")``.

Every experiment has three presets: ``smoke`` (seconds, generated or tiny data, run by the
tests), ``cpu`` (MNIST / Fashion-MNIST on a 2-core machine, minutes to about an hour; where it
had to be scaled down its JSON ``notes`` say how) and ``paper`` (the paper's settings verbatim —
CIFAR, d = 3072, the tables' grids and epochs — with the paper's numbers in
``summary.paper`` where the paper states them; for a GPU owner). Each writes
``NAME.json`` (top-level ``summary``) and ``NAME.png`` into ``--out``
(default ``benchmarks/results/repro``).
"""
from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Dict, Optional

from .core import (DEFAULT_OUT, PRESETS, Experiment, ReproError, UnknownExperimentError, UnknownReproPresetError,
                   check_data, command_line, merge, write_results)

#: experiment name -> module (imported on first use)
MODULES = {
    "single-pass": "single_pass",
    "multi-epoch": "multi_epoch",
    "depth-temperature": "depth_temperature",
    "parametric-gap": "parametric_gap",
    "hybrid-capacity": "hybrid_capacity",
    "newton-steps": "newton_steps",
    "delta-decay": "delta_decay",
    "teacher-student": "teacher_student",
    "learned-temperature": "learned_temperature",
    "vit-ffn": "vit_ffn",
}

__all__ = ["MODULES", "PRESETS", "Experiment", "ReproError", "UnknownExperimentError", "UnknownReproPresetError",
           "get", "names", "listing", "run", "DEFAULT_OUT"]


def names():
    return list(MODULES)


def get(name: str) -> Experiment:
    """The :class:`Experiment` called ``name``; an unknown name lists every experiment."""
    if name not in MODULES:
        raise UnknownExperimentError(f"unknown experiment {name!r}; the experiments are:\n{listing()}")
    return importlib.import_module(f".{MODULES[name]}", __name__).EXPERIMENT


def listing() -> str:
    """One line per experiment: name, where in the paper, what it shows."""
    exps = [get(n) for n in MODULES]
    w = max(len(e.name) for e in exps)
    return "\n".join(f"  {e.name:{w}s}  {e.paper}: {e.what}" for e in exps)


def run(name: str, preset: str, *, out=None, data_dir=None, download: bool = False, resume: bool = False,
        overrides: Optional[Dict] = None, progress: bool = True, command: Optional[str] = None) -> Dict:
    """Run one reproduction and write ``out/NAME.json`` and ``out/NAME.png``.

    Checks the name, the preset and the data it needs before any work (a missing dataset raises
    :class:`growmem.data.DatasetNotFoundError` with the paths searched and how to get the files);
    ``overrides`` replace preset settings (``{"n_train": 500}``); ``resume`` reuses the runs a
    killed invocation of the same preset finished (``out/NAME.partial.jsonl``). A diverging run
    raises :class:`growmem.train.NonFiniteLossError` naming the step and the last finite loss;
    nothing is written then. Returns the written document plus ``paths``."""
    from .core import Context
    exp = get(name)
    if preset not in PRESETS:
        raise UnknownReproPresetError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    cfg = merge(exp.preset(preset), overrides)
    out = Path(DEFAULT_OUT if out is None else out)
    check_data(exp.datasets(cfg), data_dir, download=download, who=f"{name} --preset {preset} ")
    from .. import locks
    from .core import check_overwrite
    if out.exists() and not out.is_dir():
        raise ReproError(f"--out {out} is a file, not a folder; pass a folder")
    check_overwrite(out, name, preset)
    try:                  # one invocation per folder: a second would empty the first's resume cache
        held = locks.acquire(out, "the repro output folder")
    except (locks.LockedError, OSError) as e:
        raise ReproError(str(e)) from None
    try:
        ctx = Context(name, preset, out, data_dir, resume=resume, progress=progress)
        t0 = time.perf_counter()
        try:
            payload = exp.run(ctx, cfg)
        finally:
            if ctx.bar is not None:
                ctx.bar.close()
        seconds = time.perf_counter() - t0
        json_path, png = write_results(exp, preset, cfg, payload, out, seconds=seconds, notes=ctx.notes,
                                       command=command or command_line(name, preset))
        ctx.finish()
    finally:
        locks.release(held)
    import json
    doc = json.loads(Path(json_path).read_text())
    doc["paths"] = {"json": str(json_path), "png": str(png)}
    return doc
