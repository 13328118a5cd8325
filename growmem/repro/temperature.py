"""Temperatures of growing weighted-softmax nets: learned per layer (``learned-temperature``) and
the post-training linearisation of Fig. 3/Right (``depth-temperature``).

**A temperature learned during training.** :class:`TemperedNet` is the residual growing net of
Eq. 13 (:class:`growmem.layers.ResidualGrowingNet`) whose every layer retrieves with its own
``T_l = exp(θ_l)``, ``θ_l`` a trained parameter. With an optax ``tx`` on the parameters the
:class:`~growmem.train.Trainer` learns ``θ`` from the same forward and backward pass that grows
the memories: the gradient is that of the loss of the *current* batch predicted from the rows
stored *before* it — the batch's own rows enter after the step. That is the streaming form of
the leave-one-out loss of the Nadaraya–Watson bandwidth (ref. 004): a point never predicts
itself, so ``T → 0`` (each query copying its own stored value) is not rewarded; it costs one
scalar gradient per layer (``∂L/∂T = −Σ s̄·s / T`` from the kernel's own VJP), nothing more.

**Linearised exp.** Fig. 3/Right replaces ``exp(a)`` by ``1 + a`` in every weighted-softmax layer
of a trained net. With ``a_i = ⟨k_i, q⟩ / (T√d)`` the layer collapses to a ratio of affine maps:
``s = (Σ_i ṽ_i + qᵀ Σ_i k_i ṽ_iᵀ / (T√d)) / (Σ_i w_i + qᵀ Σ_i k_i w_i / (T√d))`` —
:func:`forward` computes it (and the exact layer, for checking) from the stored rows.
"""
from __future__ import annotations

import math
from typing import Dict, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from .. import kernels
from ..layers import GrowingSpec, init_memory, rms_norm

LOG_T = "log_temperature"


class TemperedLayer(nn.Module):
    """A growing weighted-softmax (or RBF) layer retrieving with ``T = exp(θ)``, ``θ`` a parameter
    initialised at ``log spec.temperature`` (memories in RAM, no momentum or policy)."""

    spec: GrowingSpec
    d_out: int
    capacity: int = 4096

    @nn.compact
    def __call__(self, q):
        d_in = q.shape[-1]
        mem = self.variable("memory", "rows", lambda: init_memory(
            self.spec, d_in, self.d_out, self.capacity, self.make_rng("params"))).value
        theta = self.param(LOG_T, lambda _: jnp.asarray(math.log(self.spec.temperature), jnp.float32))
        if mem.policy is not None or mem.backend is not None or self.spec.momentum:
            raise ConfigError("TemperedLayer keeps its rows in RAM with no policy or momentum")
        kern = kernels.get(self.spec.kernel)
        p = kernels.reduce(kern, q, mem.k, mem.v, mem.w, temperature=jnp.exp(theta), size=mem.size,
                           chunk=self.spec.chunk, row_grads=False)
        s = self.perturb("s", kern.finish(p))
        self.sow("intermediates", "q", q)
        self.sow("intermediates", "s", s)
        return s


class TemperedNet(nn.Module):
    """Eq. 13 with a temperature per layer: ``e ← e + g_l(RMSNorm(e))``, readout on RMSNorm(e)."""

    d_out: int
    n_blocks: int
    spec: GrowingSpec
    capacity: int = 4096

    @nn.compact
    def __call__(self, x):
        e = x
        for i in range(self.n_blocks):
            e = e + TemperedLayer(self.spec, e.shape[-1], self.capacity, name=f"block_{i}")(rms_norm(e))
        return TemperedLayer(self.spec, self.d_out, self.capacity, name="readout")(rms_norm(e))


def temperatures(params) -> Dict[str, float]:
    """``{"block_0": T, ..., "readout": T}`` of a :class:`TemperedNet`'s parameters."""
    return {name: float(np.exp(np.asarray(p[LOG_T]))) for name, p in params.items() if LOG_T in p}


# ------------------------------------------------------------------------------------------ linearised exp

def layer_order(rows: Dict[str, dict], n_blocks: int) -> Sequence[str]:
    names = [f"block_{i}" for i in range(n_blocks)] + ["readout"]
    missing = [n for n in names if n not in rows]
    if missing:
        raise ConfigError(f"no rows for layers {missing}; have {sorted(rows)}")
    return names


def _rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def forward(rows: Dict[str, dict], x, temperature, n_blocks: int, *, linearise: bool = False,
            batch: int = 500) -> np.ndarray:
    """Logits of a trained weighted-softmax growing net (Eq. 13, rows from ``Trainer.host_rows()``),
    in float64 on the host. ``temperature``: one T or ``{layer: T}``. ``linearise``: every layer's
    ``exp(a)`` replaced by ``1 + a`` (Fig. 3/Right), which needs only ``Σ kṽᵀ``, ``Σ kw``, ``Σ ṽ``, ``Σ w``."""
    names = layer_order(rows, n_blocks)
    temps = {n: float(temperature[n] if isinstance(temperature, dict) else temperature) for n in names}
    prepared = {}
    for n in names:
        r = rows[n]
        w, k, v = (np.asarray(r[f], np.float64) for f in ("w", "k", "v"))
        if linearise:
            prepared[n] = (k.T @ v, k.T @ w, v.sum(0), w.sum())
        else:
            prepared[n] = (w, k, v)

    def layer(n, q):
        d = q.shape[1]
        alpha = 1.0 / (temps[n] * math.sqrt(d))
        if linearise:
            kv, kw, sv, sw = prepared[n]
            num = sv[None, :] + alpha * (q @ kv)              # Σ (1 + a_i) ṽ_i
            den = sw + alpha * (q @ kw)                       # Σ (1 + a_i) w_i
            return num / den[:, None]
        w, k, v = prepared[n]
        a = alpha * (q @ k.T)
        m = np.max(a + np.log(np.maximum(np.abs(w), 1e-30))[None, :], axis=1, keepdims=True)
        e = np.exp(a - m)
        return (e @ v) / (e @ w)[:, None]                       # Eq. 8

    outs = []
    for i in range(0, len(x), batch):
        e = np.asarray(x[i:i + batch], np.float64)
        for n in names[:-1]:
            e = e + layer(n, _rms(e))
        outs.append(layer(names[-1], _rms(e)))
    return np.concatenate(outs)
