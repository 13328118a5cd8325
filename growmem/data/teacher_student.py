"""Teacher-student regression (Sec. 5, App. F.1.2).

Inputs ``x ~ N(0, I)`` projected onto the unit sphere in ``d_in`` dimensions;
targets from a fixed random residual ReLU teacher (:class:`growmem.TeacherMLP`,
``d_e = 100``, ``L = 2``, ``d_out = 1``, LeCun-normal fan-in weights). Fresh
samples are drawn at every step.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..layers import TeacherMLP


@dataclasses.dataclass
class TeacherStudent:
    d_in: int = 100
    width: int = 100
    n_layers: int = 2
    d_out: int = 1
    seed: int = 0

    def __post_init__(self):
        self.teacher = TeacherMLP(width=self.width, n_layers=self.n_layers, d_out=self.d_out)
        self.variables = self.teacher.init(jax.random.key(self.seed), jnp.zeros((1, self.d_in)))
        self._sample = jax.jit(self._sample_impl, static_argnums=1)

    def _sample_impl(self, key, n):
        x = jax.random.normal(key, (n, self.d_in))
        x = x / jnp.linalg.norm(x, axis=1, keepdims=True)  # project onto the unit sphere
        return x, self.teacher.apply(self.variables, x)

    def sample(self, key, n: int):
        """``(x:(n, d_in), y:(n, d_out))`` for a PRNG key."""
        return self._sample(key, int(n))

    def batch(self, step: int, n: int, stream_seed: int = 1):
        """The training batch of a given step (deterministic in ``(stream_seed, step)``)."""
        return self.sample(jax.random.fold_in(jax.random.key(stream_seed + 1000 * self.seed), step), n)

    def test_set(self, n: int = 4096):
        return self.sample(jax.random.key(10_000 + self.seed), n)
