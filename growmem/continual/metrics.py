"""Metrics with Avalanche's definitions.

The evaluator (:func:`make_evaluator`) is Avalanche's ``EvaluationPlugin`` with Avalanche's
metric classes — per-experience and stream accuracy, forgetting and BWT (experience and
stream), timing — plus :class:`MemoryBytesMetric` (peak and final bytes per experience).

From the values it logs after each evaluation the runner builds the **accuracy matrix**
``a[i][j]`` (accuracy on test experience ``j`` after training experience ``i``, Avalanche's
``Top1_Acc_Exp``) and :func:`summarize` reports, named so nobody confuses them:

* ``acc_mean_over_experiences``: the mean over test experiences of the final row (each
  experience counts the same);
* ``acc_stream_weighted``: Avalanche's ``Top1_Acc_Stream`` after the last experience (every
  test *sample* counts the same: experiences weighted by their size);
* ``forgetting`` / ``bwt``: Avalanche's ``StreamForgetting`` / ``StreamBWT`` definitions —
  the mean over experiences ``j < T-1`` of ``a[j][j] − a[T-1][j]`` (BWT: its negative) —
  computed with Avalanche's standalone ``Forgetting`` / ``BWT`` classes from the matrix, so the
  same numbers come out of the fast loop, a resumed run and an online run;
* ``acc_current_mean``: the mean of the diagonal ``a[i][i]`` (on a drifting stream: accuracy
  on the teacher that is current when each experience ends).
"""
from __future__ import annotations

import functools
import re
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .errors import require_avalanche

require_avalanche()

from avalanche.evaluation import PluginMetric  # noqa: E402
from avalanche.evaluation.metric_results import MetricValue  # noqa: E402
from avalanche.evaluation.metric_utils import get_metric_name  # noqa: E402
from avalanche.evaluation.metrics import (BWT, Forgetting, accuracy_metrics, bwt_metrics,  # noqa: E402
                                          forgetting_metrics, timing_metrics)
from avalanche.training.plugins import EvaluationPlugin  # noqa: E402

from .memory_bytes import strategy_bytes  # noqa: E402

EXP_ACC = "Top1_Acc_Exp/eval_phase/test_stream"
STREAM_ACC = "Top1_Acc_Stream/eval_phase/test_stream"
TRAIN_EPOCH_ACC = "Top1_Acc_Epoch/train_phase/train_stream"
_EXP_ID = re.compile(r"/Exp(\d+)$")


# ----------------------------------------------------------------------------- bytes

class BytesRecorder:
    """Peak and final bytes of one experience from samples taken along its training."""

    def __init__(self):
        self.records: List[dict] = []
        self.current: Optional[dict] = None

    def start(self, experience: int, sample: dict, resume: Optional[dict] = None):
        self.current = dict(resume) if resume else {"experience": int(experience), "peak_in_use": 0,
                                                     "peak_allocated": 0}
        self.add(sample)

    def add(self, sample: dict):
        c = self.current
        c["peak_in_use"] = max(c["peak_in_use"], int(sample["bytes_in_use"]))
        c["peak_allocated"] = max(c["peak_allocated"], int(sample["bytes_allocated"]))

    def finish(self, sample: dict) -> dict:
        self.add(sample)
        rec = dict(self.current, final_in_use=int(sample["bytes_in_use"]),
                   final_allocated=int(sample["bytes_allocated"]), parts={k: int(v) for k, v in sample.items()})
        self.records.append(rec)
        self.current = None
        return rec


class MemoryBytesMetric(PluginMetric):
    """Avalanche plugin metric: bytes of the strategy (:mod:`growmem.continual.memory_bytes`),
    sampled before each training experience, every ``every`` training iterations (0: after the
    first iteration only), after each epoch and after the experience (when buffers are
    updated); emits ``MemoryBytes{InUse,Allocated}_{Peak,Final}`` per experience."""

    def __init__(self, every: Optional[int] = None, counter: Callable = strategy_bytes):
        super().__init__()
        self.every = every
        self.counter = counter
        self.recorder = BytesRecorder()
        #: a partial record of the experience being resumed (set by the runner)
        self.pending_resume: Optional[dict] = None
        self._it = 0

    @property
    def records(self) -> List[dict]:
        return self.recorder.records

    def result(self):
        return self.records[-1] if self.records else None

    def reset(self):
        self.recorder = BytesRecorder()

    def _every(self, strategy) -> int:
        if self.every is not None:
            return self.every
        return 1 if getattr(strategy, "learner", None) is not None else 0

    def before_training_exp(self, strategy):
        self._it = 0
        self.recorder.start(strategy.experience.current_experience, self.counter(strategy), resume=self.pending_resume)
        self.pending_resume = None

    def after_training_iteration(self, strategy):
        self._it += 1
        every = self._every(strategy)
        if (every and self._it % every == 0) or (not every and self._it == 1):
            self.recorder.add(self.counter(strategy))

    def after_training_epoch(self, strategy):
        self.recorder.add(self.counter(strategy))

    def after_training_exp(self, strategy):
        rec = self.recorder.finish(self.counter(strategy))
        x = strategy.clock.train_iterations
        out = []
        for name, key in (("MemoryBytesInUse_Peak", "peak_in_use"), ("MemoryBytesInUse_Final", "final_in_use"),
                          ("MemoryBytesAllocated_Peak", "peak_allocated"),
                          ("MemoryBytesAllocated_Final", "final_allocated")):
            out.append(MetricValue(self, get_metric_name(name, strategy, add_experience=True), rec[key], x))
        return out

    def __str__(self):
        return "MemoryBytes"


def accuracy_state(acc) -> dict:
    """The running state of an Avalanche ``Accuracy`` (its ``Mean``: summed, weight)."""
    m = acc._mean_accuracy
    return {"summed": float(m.summed), "weight": float(m.weight)}


def set_accuracy_state(acc, state: Optional[dict]):
    if state:
        acc._mean_accuracy.summed = float(state["summed"])
        acc._mean_accuracy.weight = float(state["weight"])


def epoch_accuracies(evaluator) -> list:
    """The ``Accuracy`` objects behind the evaluator's ``Top1_Acc_Epoch`` (training) metrics."""
    from avalanche.evaluation.metrics import EpochAccuracy

    return [m._metric for m in getattr(evaluator, "metrics", []) if isinstance(m, EpochAccuracy)]


def default_metrics(memory_every: Optional[int] = None, sample_bytes: Optional[int] = None) -> list:
    """Avalanche's accuracy (epoch, experience, stream), forgetting and BWT (experience, stream),
    timing (epoch, experience), and :class:`MemoryBytesMetric` (stored samples counted at
    ``sample_bytes`` each, see :func:`growmem.continual.memory_bytes.stored_sample_bytes`)."""
    counter = strategy_bytes if sample_bytes is None else functools.partial(strategy_bytes,
                                                                            sample_bytes=int(sample_bytes))
    return [accuracy_metrics(epoch=True, experience=True, stream=True),
            forgetting_metrics(experience=True, stream=True), bwt_metrics(experience=True, stream=True),
            timing_metrics(epoch=True, experience=True), MemoryBytesMetric(every=memory_every, counter=counter)]


def make_evaluator(loggers: Optional[Sequence] = None, memory_every: Optional[int] = None,
                   sample_bytes: Optional[int] = None) -> EvaluationPlugin:
    """An ``EvaluationPlugin`` with :func:`default_metrics` and ``loggers`` (none by default:
    the runner reads the values from the plugin)."""
    import warnings

    with warnings.catch_warnings():
        if not loggers:
            warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(*default_metrics(memory_every, sample_bytes), loggers=list(loggers or []))


def memory_metric(evaluator: EvaluationPlugin) -> Optional[MemoryBytesMetric]:
    return next((m for m in evaluator.metrics if isinstance(m, MemoryBytesMetric)), None)


# ----------------------------------------------------------------------------- reading logged values

def accuracy_row(metrics: Dict[str, float], n_experiences: int) -> List[Optional[float]]:
    """``[a_j]`` for test experiences ``j`` from Avalanche's ``Top1_Acc_Exp`` values."""
    row: List[Optional[float]] = [None] * n_experiences
    for k, v in metrics.items():
        if k.startswith(EXP_ACC):
            m = _EXP_ID.search(k)
            if m and int(m.group(1)) < n_experiences:
                row[int(m.group(1))] = float(v)
    return row


def stream_accuracy(metrics: Dict[str, float]) -> Optional[float]:
    """Avalanche's sample-weighted ``Top1_Acc_Stream`` of the test stream."""
    vals = [float(v) for k, v in metrics.items() if k.startswith(STREAM_ACC)]
    return vals[-1] if vals else None


def avalanche_stream_forgetting(metrics: Dict[str, float]) -> Optional[float]:
    v = metrics.get("StreamForgetting/eval_phase/test_stream")
    return None if v is None else float(v)


def avalanche_stream_bwt(metrics: Dict[str, float]) -> Optional[float]:
    v = metrics.get("StreamBWT/eval_phase/test_stream")
    return None if v is None else float(v)


# ----------------------------------------------------------------------------- summary

def _mean_of(metric) -> Optional[float]:
    vals = list(metric.result().values())
    return float(np.mean(vals)) if vals else None


def forgetting_and_bwt(matrix: Sequence[Sequence[float]], trained: Optional[Sequence[int]] = None):
    """``(forgetting, bwt, per_experience_forgetting)`` of a square accuracy matrix, with
    Avalanche's ``Forgetting`` / ``BWT`` classes: initial = ``a[j][j]`` (right after training
    on ``j``), last = the final row, averaged over ``j < T-1`` (the last experience has no
    later value). ``None`` when there is only one row."""
    a = [list(r) for r in matrix]
    if len(a) < 2:
        return None, None, {}
    f, b = Forgetting(), BWT()
    t_last = len(a) - 1
    for j in range(len(a)):
        if j < len(a[j]) and a[j][j] is not None:
            f.update(j, a[j][j], initial=True)
            b.update(j, a[j][j], initial=True)
    for j in range(t_last):  # the final evaluation: every experience except the one just trained
        if a[t_last][j] is not None:
            f.update(j, a[t_last][j])
            b.update(j, a[t_last][j])
    per = {int(k): float(v) for k, v in f.result().items()}
    return _mean_of(f), _mean_of(b), per


def summarize(matrix: Sequence[Sequence[float]], stream_weighted: Optional[float], *,
              square: bool = True) -> dict:
    """The headline numbers of one run (see the module docstring). ``square=False`` for a
    method evaluated once at the end (Joint): the matrix is its final row only."""
    a = np.asarray([[np.nan if v is None else v for v in r] for r in matrix], float)
    final = a[-1]
    out = {"acc_mean_over_experiences": float(np.nanmean(final)) if np.isfinite(final).any() else None,
           "acc_stream_weighted": None if stream_weighted is None else float(stream_weighted),
           "forgetting": None, "bwt": None, "forgetting_per_experience": {}, "acc_current_mean": None}
    if square and a.shape[0] == a.shape[1]:
        f, b, per = forgetting_and_bwt(matrix)
        out.update(forgetting=f, bwt=b, forgetting_per_experience=per,
                   acc_current_mean=float(np.nanmean(np.diag(a))))
    return out
