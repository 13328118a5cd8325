"""Avalanche's own strategies as baselines, and how their state is saved for a resume.

Every baseline is Avalanche's strategy class with Avalanche's ``SimpleMLP`` (2 hidden layers
of 400 units, **no dropout**; a classifier head per task on task-incremental streams), SGD
(lr 0.01, momentum 0.9), mini-batches of 64:

=============== ============================================================================
``naive``        ``Naive`` (fine-tuning, the lower bound)
``ewc``          ``EWC``, λ = 0.4, mode ``separate`` (``examples/ewc_mnist.py`` defaults)
``lwf``          ``LwF``, α_i = i²/(i+1) for experience i (0, 0.5, 1.333, 2.25, 3.2, ... — the
                 ``--lwf_alpha`` list of ``examples/lwf_mnist.py``, extended by its formula to
                 streams longer than 5), temperature 1 (same example)
``gdumb``        ``GDumb``, 4400 samples (``continual-learning-baselines`` Split-MNIST setting)
``replay_N``     ``Replay`` with a buffer of N samples (``replay_1000``, ``replay_4400``, any N)
``cumulative``   ``Cumulative`` (retrains on everything seen so far, the upper bound)
``joint``        ``JointTraining`` (one pass over the whole stream at once, offline)
=============== ============================================================================

Epochs per experience: 2 on Split-MNIST, 1 on Permuted-MNIST (and elsewhere, unless given).

**Resume.** After each experience (and its evaluation) :func:`save_state` pickles the model,
the optimizer and the strategy's plugins (EWC's importances, LwF's previous model, the replay
and GDumb buffers...) and the strategy-specific data (Cumulative's dataset); the stream's
underlying datasets are pickled *by reference* (``persistent_id``) and re-attached to the same
stream rebuilt from its seed by :func:`load_state`. A run killed during an experience restarts
that experience from the state saved after the previous one (and the torch RNG is re-seeded
from ``(seed, experience)`` before every experience), so it ends with the same results.
``joint`` trains once on everything: killed, it starts over.
"""
from __future__ import annotations

import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from .errors import require_avalanche, unknown

require_avalanche()

import torch  # noqa: E402

BASELINES = ("naive", "ewc", "lwf", "gdumb", "replay_1000", "replay_4400", "cumulative", "joint")
_REPLAY = re.compile(r"^replay_(\d+)$")

#: the shared settings of every baseline (see the module docstring)
SETTINGS: Dict[str, Any] = {
    "hidden_size": 400, "hidden_layers": 2, "drop_rate": 0.0, "lr": 0.01, "momentum": 0.9, "train_mb_size": 64,
    "eval_mb_size": 256, "ewc_lambda": 0.4, "ewc_mode": "separate", "lwf_temperature": 1.0,
    "gdumb_mem_size": 4400,
}
#: epochs per experience by stream (others: 1)
EPOCHS = {"split_mnist": 2, "permuted_mnist": 1}


def is_baseline(name: str) -> bool:
    return name in BASELINES or bool(_REPLAY.match(name))


def check_baseline(name: str) -> str:
    if not is_baseline(name):
        raise unknown("baseline", name, BASELINES, "replay_N for any buffer size N")
    return name


def lwf_alphas(n_experiences: int):
    """α_i = i²/(i+1): 0, 0.5, 1.333, 2.25, 3.2 for 5 experiences (Avalanche's LwF example)."""
    return [i * i / (i + 1) for i in range(max(1, n_experiences))]


def experience_seed(seed: int, experience: int) -> int:
    """The torch seed set before training ``experience`` (same for every method and resume)."""
    return int(np.random.SeedSequence([int(seed), int(experience), 0x61766C]).generate_state(1)[0])


def make_model(stream, settings: Optional[dict] = None):
    """Avalanche's ``SimpleMLP``; on a task-incremental stream with a head per task
    (``as_multitask(model, "classifier")``, as Avalanche's ``examples/ewc_mnist.py`` does)."""
    from avalanche.models import SimpleMLP, as_multitask

    s = {**SETTINGS, **(settings or {})}
    model = SimpleMLP(num_classes=stream.n_classes, input_size=stream.input_size, hidden_size=s["hidden_size"],
                      hidden_layers=s["hidden_layers"], drop_rate=s["drop_rate"])
    return as_multitask(model, "classifier") if stream.task_incremental else model


def make_baseline(name: str, stream, *, seed: int, evaluator, epochs: Optional[int] = None,
                  settings: Optional[dict] = None, plugins=None, device="cpu"):
    """Avalanche's strategy for baseline ``name`` on ``stream`` (model initialised from ``seed``)."""
    from avalanche.training.supervised import (EWC, GDumb, Cumulative, JointTraining, LwF, Naive, Replay)

    check_baseline(name)
    s = {**SETTINGS, **(settings or {})}
    torch.manual_seed(int(seed))
    model = make_model(stream, s)
    opt = torch.optim.SGD(model.parameters(), lr=s["lr"], momentum=s["momentum"])
    if epochs is None:
        epochs = EPOCHS.get(stream.name, 1)
    common = dict(model=model, optimizer=opt, criterion=torch.nn.CrossEntropyLoss(), train_mb_size=s["train_mb_size"],
                  train_epochs=int(epochs), eval_mb_size=s["eval_mb_size"], device=device, evaluator=evaluator,
                  plugins=list(plugins or []))
    m = _REPLAY.match(name)
    if m:
        return Replay(mem_size=int(m.group(1)), **common)
    if name == "naive":
        return Naive(**common)
    if name == "ewc":
        return EWC(ewc_lambda=s["ewc_lambda"], mode=s["ewc_mode"], **common)
    if name == "lwf":
        return LwF(alpha=lwf_alphas(stream.n_experiences), temperature=s["lwf_temperature"], **common)
    if name == "gdumb":
        return GDumb(mem_size=s["gdumb_mem_size"], **common)
    if name == "cumulative":
        return Cumulative(**common)
    return JointTraining(**common)


def describe(name: str, stream, epochs: Optional[int] = None, settings: Optional[dict] = None) -> dict:
    s = {**SETTINGS, **(settings or {})}
    out = {"model": f"SimpleMLP({s['hidden_layers']} x {s['hidden_size']}, drop_rate={s['drop_rate']})"
                    + (", a head per task" if stream.task_incremental else ""),
           "optimizer": f"SGD(lr={s['lr']}, momentum={s['momentum']})", "train_mb_size": s["train_mb_size"],
           "epochs": int(epochs if epochs is not None else EPOCHS.get(stream.name, 1))}
    m = _REPLAY.match(name)
    if m:
        out["mem_size"] = int(m.group(1))
    elif name == "ewc":
        out.update(ewc_lambda=s["ewc_lambda"], ewc_mode=s["ewc_mode"])
    elif name == "lwf":
        out.update(lwf_alpha=lwf_alphas(stream.n_experiences), lwf_temperature=s["lwf_temperature"])
    elif name == "gdumb":
        out["mem_size"] = s["gdumb_mem_size"]
    return out


# ----------------------------------------------------------------------------- resume

def leaf_datasets(benchmark) -> list:
    """The underlying (non-Avalanche) datasets of every experience of the benchmark, in a
    deterministic order: what :func:`save_state` pickles by reference."""
    out, seen = [], set()

    def walk(ds):
        subs = getattr(ds, "_datasets", None)  # Avalanche datasets and their flat-data nodes
        if isinstance(subs, (list, tuple)):
            for d in subs:
                walk(d)
        elif id(ds) not in seen:
            seen.add(id(ds))
            out.append(ds)

    for stream_name in ("train_stream", "test_stream"):
        for exp in getattr(benchmark, stream_name):
            walk(exp.dataset)
    return out


class _RefPickler(pickle.Pickler):
    def __init__(self, f, refs):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._refs = {id(d): i for i, d in enumerate(refs)}

    def persistent_id(self, obj):
        i = self._refs.get(id(obj))
        return None if i is None else ("growmem-continual-dataset", i)


class _RefUnpickler(pickle.Unpickler):
    def __init__(self, f, refs):
        super().__init__(f)
        self._list = refs

    def persistent_load(self, pid):
        tag, i = pid
        if tag != "growmem-continual-dataset" or i >= len(self._list):
            raise pickle.UnpicklingError(f"checkpoint refers to dataset #{i} that the rebuilt stream does not have "
                                         f"(it holds {len(self._list)}): the stream differs from the saved run's")
        return self._list[i]


def _strategy_parts(strategy) -> dict:
    from avalanche.training.plugins import EvaluationPlugin

    # the evaluator (loggers, metric state) and run-time helpers (progress bars) are not learning state
    plugins = {i: p for i, p in enumerate(strategy.plugins)
               if not isinstance(p, EvaluationPlugin) and not getattr(p, "transient", False)}
    parts = {"model": strategy.model, "optimizer": strategy.optimizer, "plugins": plugins}
    for attr in ("dataset", "optimized_param_id"):  # Cumulative's data; the optimizer's param bookkeeping
        if hasattr(strategy, attr):
            parts[attr] = getattr(strategy, attr)
    return parts


def save_state(strategy, path, benchmark, extra: Optional[dict] = None):
    """Pickle the strategy's learning state to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            _RefPickler(f, leaf_datasets(benchmark)).dump({"parts": _strategy_parts(strategy), "extra": extra})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(strategy, path, benchmark) -> Optional[dict]:
    """Install the state saved by :func:`save_state` into a freshly built ``strategy`` (same
    baseline, same stream); returns the saved ``extra``."""
    with open(path, "rb") as f:
        doc = _RefUnpickler(f, leaf_datasets(benchmark)).load()
    parts = doc["parts"]
    strategy.model = parts["model"]
    strategy.optimizer = parts["optimizer"]
    for i, p in parts["plugins"].items():
        strategy.plugins[i] = p
        if type(p).__name__ == "Clock":
            strategy.clock = p
    for attr in ("dataset", "optimized_param_id"):
        if attr in parts:
            setattr(strategy, attr, parts[attr])
    return doc.get("extra")
