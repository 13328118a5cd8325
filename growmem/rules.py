"""Growth rules: turn ``(q, s, g)`` of one step into candidate rows.

Each rule is ``rule(q, s, g, **hyper) -> Rows`` with ``q:(B, d_in)`` the layer
input, ``s:(B, d_out)`` the layer output on ``q`` and ``g:(B, d_out)`` the
gradient of the loss with respect to ``s``. The unit of ``g`` (per-sample
``∂ℓ_n/∂s_n`` or the batch-mean gradient ``∂L/∂s_n = g_n/B``) is chosen by the
layer (``grad_unit``), not here.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from .errors import ConfigError


class Rows(NamedTuple):
    """Candidate rows: ``w:(B,)``, ``k:(B, d_in)``, ``v:(B, d_out)`` (ṽ for softmax)."""

    w: jax.Array
    k: jax.Array
    v: jax.Array


def sgd(q, s, g, *, eta: float) -> Rows:
    """Linear / PDK / RBF rule (Eq. 19, Alg. 5): ``k = q``, ``v = -η g`` (w = 1, unused)."""
    return Rows(w=jnp.ones(q.shape[:1], q.dtype), k=q, v=-eta * g)


def weighted_softmax(q, s, g, *, eta: float, beta: float, clip: Optional[float] = None) -> Rows:
    """Alg. 3: ``w = max(0, η⟨s, g⟩)``, ``k = q``, ``ṽ = -β g``.

    ``clip`` optionally clips ``δ = ⟨s, g⟩`` to ``[-clip, clip]`` first (the public
    reference implementation clips to ``[-B, B]``).
    """
    delta = jnp.sum(s * g, axis=-1)                      # δ = ⟨s, g⟩   (Alg. 3 line 7)
    if clip is not None:
        delta = jnp.clip(delta, -clip, clip)
    return Rows(w=jnp.maximum(0.0, eta * delta), k=q, v=-beta * g)


def gauge(q, s, g, *, eta: float, beta: float, alpha: float, eps: float = 1e-8) -> Rows:
    """Alg. 2 (gauge-invariant, updates of the order of ‖g‖):

    ``w = η α ‖g‖``, ``ṽ = (-η α² - β + η α ⟨s, g⟩ / (‖g‖ + ε)) g``, ``k = q``.
    """
    gn = jnp.linalg.norm(g, axis=-1)
    sg = jnp.sum(s * g, axis=-1)
    w = eta * alpha * gn                                             # Alg. 2 line 6
    coef = -eta * alpha**2 - beta + eta * alpha * sg / (gn + eps)    # Alg. 2 line 8
    return Rows(w=w, k=q, v=coef[:, None] * g)


def target(q, s, g) -> Rows:
    """Nadaraya–Watson rows (App. "test-time regression" view): ``w = 1``, ``k = q``, ``ṽ = y``,
    the target itself. ``y`` is recovered from the squared-error gradient: for
    ``ℓ_n = ½‖s_n − y_n‖²``, ``g_n = s_n − y_n`` so ``y_n = s_n − g_n`` (exact with
    ``grad_unit = "per_sample"`` and the ``mse`` loss). :class:`growmem.nadaraya.TargetMemory`
    stores targets directly."""
    return Rows(w=jnp.ones(q.shape[:1], q.dtype), k=q, v=s - g)


RULES = {"sgd": sgd, "weighted_softmax": weighted_softmax, "gauge": gauge, "target": target}
#: hyperparameters each rule accepts (used to validate configurations)
RULE_HYPER = {
    "sgd": {"eta"},
    "weighted_softmax": {"eta", "beta", "clip"},
    "gauge": {"eta", "beta", "alpha", "eps"},
    "target": set(),
}
#: hyperparameters each rule needs (no default)
RULE_REQUIRED = {
    "sgd": {"eta"},
    "weighted_softmax": {"eta", "beta"},
    "gauge": {"eta", "beta", "alpha"},
    "target": set(),
}


def get(name: str):
    try:
        return RULES[name]
    except KeyError:
        raise ConfigError(f"unknown rule {name!r}; choose one of {sorted(RULES)}") from None
