"""growmem on Avalanche streams, side by side with Avalanche's own strategies.

Needs the ``continual`` extra (``pip install 'growmem[continual]'``: avalanche-lib and
PyTorch); importing this package does not import them — the names below are loaded on first
use, and a missing extra raises :class:`MissingExtraError` naming it.

* :func:`run_continual` — growmem and Avalanche baselines on one stream, same data and seeds,
  accuracy matrix / forgetting / BWT / bytes, checkpoints and exact resume
  (:mod:`growmem.continual.runner`); ``growmem continual`` on the command line
  (:mod:`growmem.app.continual`).
* :func:`make_stream` / :data:`STREAMS` — Split-, Permuted-, Rotated-MNIST, Split-CIFAR10/100
  through Avalanche's generators, the embedded ``drifting_teacher``, or any Avalanche
  benchmark object (:mod:`growmem.continual.streams`).
* :class:`GrowmemStrategy` — a ``SupervisedTemplate`` subclass wrapping a growmem learner
  (:mod:`growmem.continual.strategy`); :class:`FastLoop` — the same training and metrics
  without the template (:mod:`growmem.continual.fast`).
* :class:`GrowmemConfig`, :class:`GrowmemLearner` — the growmem recipe (a preset) and the
  per-task models (:mod:`growmem.continual.learner`, no torch needed).
* :func:`make_evaluator`, :func:`summarize` — Avalanche's metrics plus bytes
  (:mod:`growmem.continual.metrics`); :func:`growmem_bytes`, :func:`torch_strategy_bytes`
  (:mod:`growmem.continual.memory_bytes`).
"""
from __future__ import annotations

import importlib

from .errors import (EXTRA_INSTALL, DatasetNotFoundError, InputShapeError, MissingExtraError, UnknownNameError,
                     require_avalanche)
from .learner import DEFAULT_PRESET, GrowmemConfig, GrowmemLearner

#: public name -> module that defines it (imported on first use; those need avalanche)
_LAZY = {
    "run_continual": "runner", "default_methods": "runner", "valid_methods": "runner",
    "make_stream": "streams", "describe_benchmark": "streams", "Stream": "streams", "STREAMS": "streams",
    "GrowmemStrategy": "strategy", "batch_order": "strategy",
    "FastLoop": "fast",
    "make_evaluator": "metrics", "default_metrics": "metrics", "summarize": "metrics",
    "forgetting_and_bwt": "metrics", "MemoryBytesMetric": "metrics",
    "make_baseline": "baselines", "BASELINES": "baselines",
    "growmem_bytes": "memory_bytes", "target_bytes": "memory_bytes", "torch_strategy_bytes": "memory_bytes",
}
_NO_TORCH = {"growmem_bytes": "memory_bytes", "target_bytes": "memory_bytes"}  # importable without the extra

__all__ = ["EXTRA_INSTALL", "DatasetNotFoundError", "InputShapeError", "MissingExtraError", "UnknownNameError",
           "DEFAULT_PRESET", "GrowmemConfig", "GrowmemLearner", *_LAZY]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'growmem.continual' has no attribute {name!r}")
    if name not in _NO_TORCH:
        require_avalanche()
    return getattr(importlib.import_module(f".{mod}", __name__), name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
