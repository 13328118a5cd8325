"""``drifting_teacher``: an embedded, download-free stream whose labelling function drifts.

Inputs are standard normal vectors in ``d`` dimensions; the class of an input is the argmax of
a random teacher network ``logits = W2 tanh(W1 x)`` (``W1``: ``hidden × d``, ``W2``: ``C ×
hidden`` with unit-norm rows, so the classes are roughly balanced). The teacher changes

* **abruptly between experiences**: experience ``e + 1`` starts from
  ``ρ θ_end(e) + sqrt(1 − ρ²) θ_fresh`` with ``ρ = 1 − change`` (``change = 1``: an independent
  teacher, ``0``: no jump), and
* **gradually within an experience**: sample ``i`` of ``n`` is labelled by
  ``θ(t) = (1 − t) θ_start + t θ_end`` with ``t = i / (n − 1)``, where ``θ_end`` is ``θ_start``
  moved by ``drift`` times a fresh random direction (renormalised).

The training samples of an experience are stored in time order (a learner that reads them in
order, ``shuffle=False``, sees the gradual drift; shuffled, it is label noise). The test set of
experience ``e`` is labelled by ``θ_end(e)``, the teacher that is current when training on ``e``
ends, so the diagonal ``a[e][e]`` of the accuracy matrix is the accuracy on the current teacher
after each change, and ``a[i][j], j < i`` the agreement with teachers that no longer hold.

Everything is a pure function of the settings (numpy ``default_rng``), so two runs with the same
seed build the same stream.
"""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

import numpy as np

from .errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DriftingTeacher:
    """The settings of a drifting-teacher stream (all samples generated from ``seed``)."""

    n_experiences: int = 6
    samples_per_experience: int = 2000
    test_samples: int = 1000
    d: int = 8
    n_classes: int = 5
    hidden: int = 16
    change: float = 0.7
    drift: float = 0.3
    seed: int = 0

    def __post_init__(self):
        for name in ("n_experiences", "samples_per_experience", "test_samples", "d", "hidden"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"drifting_teacher: {name} must be >= 1, got {getattr(self, name)}")
        if self.n_classes < 2:
            raise ConfigError(f"drifting_teacher: n_classes must be >= 2, got {self.n_classes}")
        if not 0.0 <= self.change <= 1.0:
            raise ConfigError(f"drifting_teacher: change must be in [0, 1], got {self.change}")
        if self.drift < 0:
            raise ConfigError(f"drifting_teacher: drift must be >= 0, got {self.drift}")

    # ------------------------------------------------------------------ teachers
    def _fresh(self, rng) -> Tuple[np.ndarray, np.ndarray]:
        w1 = rng.standard_normal((self.hidden, self.d)) / np.sqrt(self.d)
        w2 = rng.standard_normal((self.n_classes, self.hidden))
        return w1, w2

    @staticmethod
    def _mix(a, b, rho):
        return tuple(rho * x + np.sqrt(1.0 - rho * rho) * y for x, y in zip(a, b))

    def _move(self, theta, rng):
        """``theta`` moved by ``drift`` times a random direction, keeping its scale."""
        fresh = self._fresh(rng)
        out = []
        for x, f in zip(theta, fresh):
            y = x + self.drift * f * (np.linalg.norm(x) / max(np.linalg.norm(f), 1e-12))
            out.append(y * (np.linalg.norm(x) / max(np.linalg.norm(y), 1e-12)))
        return tuple(out)

    def teachers(self) -> List[Tuple[tuple, tuple]]:
        """``[(θ_start, θ_end)]`` per experience, each ``θ = (W1, W2)``."""
        rng = np.random.default_rng([self.seed, 1])
        out = []
        theta = self._fresh(rng)
        for e in range(self.n_experiences):
            if e > 0:
                theta = self._mix(out[-1][1], self._fresh(rng), 1.0 - self.change)
            out.append((theta, self._move(theta, rng)))
        return out

    @staticmethod
    def logits(x, w1, w2):
        """Teacher logits; ``w1``/``w2`` may carry a leading per-sample axis."""
        w2 = w2 / np.linalg.norm(w2, axis=-1, keepdims=True)
        if w1.ndim == 3:  # per-sample teachers
            h = np.tanh(np.einsum("nhd,nd->nh", w1, x))
            return np.einsum("nch,nh->nc", w2, h)
        return np.tanh(x @ w1.T) @ w2.T

    def label(self, x, theta) -> np.ndarray:
        return self.logits(x, *theta).argmax(-1).astype(np.int64)

    # ------------------------------------------------------------------ samples
    def experience(self, e: int, split: str = "test"):
        """``(x_train, y_train, x_eval, y_eval)`` of experience ``e`` (train in time order). The
        evaluation samples are labelled by ``θ_end(e)``; ``split="validation"`` draws them from a random
        stream of their own (same teacher, never the test samples)."""
        start, end = self.teachers()[e]
        rng = np.random.default_rng([self.seed, 2, e])
        n = self.samples_per_experience
        x = rng.standard_normal((n, self.d)).astype(np.float32)
        t = np.linspace(0.0, 1.0, n) if n > 1 else np.ones(1)
        y = np.empty(n, np.int64)
        for lo in range(0, n, 512):  # per-sample interpolated teachers, in blocks to bound memory
            tt = t[lo:lo + 512, None, None]
            w1 = (1 - tt) * start[0][None] + tt * end[0][None]
            w2 = (1 - tt) * start[1][None] + tt * end[1][None]
            y[lo:lo + 512] = self.logits(x[lo:lo + 512].astype(np.float64), w1, w2).argmax(-1)
        if split == "validation":
            rng = np.random.default_rng([self.seed, 3, e])
        elif split != "test":
            raise ConfigError(f"split must be 'test' or 'validation', got {split!r}")
        xt = rng.standard_normal((self.test_samples, self.d)).astype(np.float32)
        yt = self.label(xt.astype(np.float64), end)
        return x, y, xt, yt

    def arrays(self, split: str = "test"):
        """``(train, eval)``: lists of ``(x, y)`` numpy pairs, one per experience."""
        train, test = [], []
        for e in range(self.n_experiences):
            x, y, xt, yt = self.experience(e, split)
            train.append((x, y))
            test.append((xt, yt))
        return train, test

    def benchmark(self, split: str = "test"):
        """The stream as an Avalanche benchmark (``tensors_benchmark``; task label 0 throughout)."""
        from .errors import require_avalanche

        require_avalanche()
        import torch
        from avalanche.benchmarks import tensors_benchmark

        train, test = self.arrays(split)
        as_t = lambda pairs: [[torch.from_numpy(x), torch.from_numpy(y)] for x, y in pairs]
        return tensors_benchmark(as_t(train), as_t(test), task_labels=[0] * self.n_experiences)
