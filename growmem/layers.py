"""Flax modules: growing layers and networks, and the parametric baselines.

A :class:`GrowingLayer` keeps its rows in the ``"memory"`` collection as a
:class:`growmem.memory.Memory` whose static ``spec`` says how it retrieves and
grows. Its output is wrapped with ``Module.perturb("s", ...)`` so one backward
pass gives ``g = ∂L/∂s`` for every growing layer, and it sows ``q`` and ``s``
into ``"intermediates"``; :mod:`growmem.train` turns these into new rows.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from .errors import ConfigError, WrongTypeError
from . import backends, kernels, memory as memlib, policies, rules
from .units import MIN_TEMPERATURE, check_temperature  # noqa: F401  (MIN_TEMPERATURE: re-exported)

GRAD_UNITS = ("per_sample", "batch_mean")
INITS = ("empty", "random", "zeros")
#: rows preallocated per growing layer before the first geometric growth
DEFAULT_CAPACITY = 4096


@dataclasses.dataclass(frozen=True)
class GrowingSpec:
    """Static description of one growing layer (hashable: it lives in the pytree metadata).

    kernel       a name in :data:`growmem.kernels.KERNELS`: ``linear`` | ``rbf`` | ``weighted_softmax``
    temperature  ``T`` of Eq. 8 / Alg. 5 (ignored by ``linear``)
    rule         one of the kernel's rules: ``sgd`` (linear, rbf) | ``weighted_softmax`` (Alg. 3) |
                 ``gauge`` (Alg. 2)
    hyper        rule hyperparameters as sorted ``(name, value)`` pairs (η, β, α, clip, eps)
    grad_unit    ``per_sample``: rules see ``g_n = ∂ℓ_n/∂s_n`` (the unit of Algs. 3–5; the
                 trainer multiplies the batch-mean gradient by B); ``batch_mean``: rules
                 see ``∂(mean loss)/∂s_n = g_n / B`` (the unit of the paper's gauge settings)
    momentum     μ of the timestamp momentum (Eq. 23/91); 0 disables it (or use the
                 :func:`growmem.policies.momentum` policy — not both)
    init         D0: ``empty``; ``random`` (F.3: ``init_rows`` RMS-normalised N(0,1) keys
                 and values, w = 1/init_rows); ``zeros`` (F.4: zero keys and values, w = 1/B)
    init_rows    rows of D0 (the paper uses the batch size B)
    chunk        upper bound on rows per retrieval chunk (kernels.chunk_rows sizes chunks to the cache)
    row_dtype    ``float32`` | ``bfloat16``: how keys and values are stored (``w`` stays float32;
                 retrieval accumulates in float32). bfloat16 halves the bytes a step reads and a
                 memory costs

    Which rows enter, leave or are trained is the job of a :class:`growmem.policies.Policy`, given
    to the trainer (``Trainer(model, policy=...)``), not of the spec.
    """

    kernel: str = "weighted_softmax"
    temperature: float = 1.0
    rule: str = "weighted_softmax"
    hyper: tuple = (("beta", 1.0), ("eta", 1.0))
    grad_unit: str = "per_sample"
    momentum: float = 0.0
    init: str = "empty"
    init_rows: int = 0
    chunk: int = kernels.DEFAULT_CHUNK
    row_dtype: str = "float32"

    def __post_init__(self):
        kern = kernels.get(self.kernel)
        if self.rule not in kern.rules:
            raise ConfigError(f"rule {self.rule!r} does not fit kernel {self.kernel!r}; use one of {kern.rules}")
        allowed = rules.RULE_HYPER[self.rule]
        unknown = {k for k, _ in self.hyper} - allowed
        if unknown:
            raise ConfigError(f"rule {self.rule!r} takes hyperparameters {sorted(allowed)}, got {sorted(unknown)}")
        missing = rules.RULE_REQUIRED[self.rule] - {k for k, _ in self.hyper}
        if missing:
            raise ConfigError(f"rule {self.rule!r} needs the hyperparameters {sorted(missing)} (e.g. eta = 0.003, "
                              f"beta = 3.0 for the weighted softmax, App. G.2)")
        for k, v in self.hyper:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"rule hyperparameter {k} must be a finite number, got {v!r}")
        if self.grad_unit not in GRAD_UNITS:
            raise ConfigError(f"grad_unit must be one of {GRAD_UNITS}, got {self.grad_unit!r}")
        if self.init not in INITS:
            raise ConfigError(f"init must be one of {INITS}, got {self.init!r}")
        if self.init != "empty" and self.init_rows <= 0:
            raise ConfigError(f"init={self.init!r} needs init_rows > 0 (the paper uses the batch size)")
        if kern.uses_temperature:
            check_temperature(self.temperature)
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum μ must be in [0, 1), got {self.momentum}")
        if self.chunk <= 0:
            raise ConfigError(f"chunk must be positive, got {self.chunk}")
        memlib.row_dtype(self.row_dtype)

    @classmethod
    def make(cls, kernel="weighted_softmax", rule=None, **kw) -> "GrowingSpec":
        """Build a spec; rule hyperparameters (eta, beta, alpha, clip, eps) go in as keywords."""
        if "policy" in kw or "hybrid" in kw:
            raise WrongTypeError("a GrowingSpec no longer holds a policy: pass it to the trainer, "
                                 "Trainer(model, policy=...) (hybrid rows: policies.hybrid(tx) in the chain)")
        rule = rule or kernels.get(kernel).rules[0]
        hyper = {k: kw.pop(k) for k in list(kw) if k in rules.RULE_HYPER.get(rule, ())}
        return cls(kernel=kernel, rule=rule, hyper=tuple(sorted(hyper.items())), **kw)

    @property
    def hyperparameters(self) -> dict:
        return dict(self.hyper)

    def candidate_rows(self, q, s, g) -> rules.Rows:
        """Rows that the rule proposes for ``(q, s, g)`` (``g`` already in ``grad_unit``)."""
        return rules.get(self.rule)(q, s, g, **self.hyperparameters)


def rms_norm(x, eps: float = 1e-6):
    """RMSNorm without learned scale: ``‖RMSNorm(x)‖ = √d``."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def init_memory(spec: GrowingSpec, d_in: int, d_out: int, capacity: int, key) -> memlib.Memory:
    """The layer's D0 (Alg. 3 / F.3, F.4) in a memory of the given capacity."""
    rd = memlib.row_dtype(spec.row_dtype)
    if spec.init == "empty":
        return memlib.empty(d_in, d_out, capacity, row_dtype=rd, spec=spec)
    b = spec.init_rows
    w = jnp.full((b,), 1.0 / b)
    if spec.init == "random":
        kk, kv = jax.random.split(key)
        k = rms_norm(jax.random.normal(kk, (b, d_in)))
        v = rms_norm(jax.random.normal(kv, (b, d_out)))
        # the table stores ṽ = w·v for the weighted softmax (Eq. 8)
        v = v * w[:, None] if kernels.get(spec.kernel).normalised else v
    else:
        k, v = jnp.zeros((b, d_in)), jnp.zeros((b, d_out))
    return memlib.from_rows(w, k, v, capacity=max(capacity, b), spec=spec, row_dtype=rd)


def retrieve(mem: memlib.Memory, q, t=None):
    """Kernel retrieval over a memory, with its momentum / policy coefficients (no ``W0 q``).

    Wherever the rows live (in RAM, sharded over a mesh, partly on disk: ``mem.backend``),
    the partial results are merged by the kernel's rule; the stored rows are differentiated
    only when the memory's policy trains them (hybrid, Alg. 4).
    """
    if t is not None:
        mem = mem.replace(t=jnp.asarray(t, jnp.int32))
    kern = kernels.get(mem.spec.kernel)
    row_grads = mem.policy is not None and mem.policy.trains_rows
    p = backends.of(mem).reduce(kern, mem, q, policies.coefficient_fn(mem.spec, mem.policy), row_grads=row_grads)
    return kern.finish(p)


class GrowingLayer(nn.Module):
    """One growing layer ``s = retrieve(memory, q)`` (+ ``W0 q`` for the linear kernel, Eq. 1).

    ``W0`` lives in the ``"frozen"`` collection: in the dual form it is the initial
    weight matrix and all learning is in the rows.
    """

    spec: GrowingSpec
    d_out: int
    capacity: int = DEFAULT_CAPACITY

    @nn.compact
    def __call__(self, q):
        if q.ndim != 2:
            raise ConfigError(f"{self.name}: expected q of shape (B, d_in), got {q.shape}")
        d_in = q.shape[-1]
        mem_var = self.variable("memory", "rows", lambda: init_memory(
            self.spec, d_in, self.d_out, self.capacity, self.make_rng("params")))
        mem = mem_var.value
        if mem.d_in != d_in:
            raise ConfigError(f"{self.name}: memory keys have d_in={mem.d_in} but the query has {d_in}")
        s = retrieve(mem, q)
        if kernels.get(self.spec.kernel).base_weight:
            w0 = self.variable("frozen", "W0", lambda: nn.initializers.lecun_normal()(
                self.make_rng("params"), (d_in, self.d_out))).value
            if mem.policy is not None and mem.policy.retention != 1.0:
                # weight decay shrinks W0 too: (1-γ)^t W0 (Eq. 100)
                s = s + (mem.policy.retention ** mem.t) * (q @ w0)
            else:
                s = s + q @ w0
        s = self.perturb("s", s)
        self.sow("intermediates", "q", q)
        self.sow("intermediates", "s", s)
        return s


class ResidualGrowingNet(nn.Module):
    """Eq. 13: ``e ← e + g_D(RMSNorm(e))`` for L blocks, then a growing readout on RMSNorm(e).

    ``block`` and ``readout`` are the specs of the residual blocks and the readout;
    residual blocks keep ``d_out = d_e``. ``nonlinearity`` (optional) is applied to
    each block output (None for RBF / weighted softmax, whose kernel is nonlinear).

    ``replay_memory``: a growing layer ``replay`` beside the network, queried with RMSNorm(x) like the first
    block, whose output the network does not use: its rows are the inputs it saw (and, with a labels or
    class-balanced capacity policy on it, their classes), a rehearsal buffer apart from the block's rows
    (:class:`growmem.train.SelfReplay` draws from it), so the block can keep or freeze its own rows
    whatever the buffer keeps. Its values are one wide (the rule's ṽ of a zero error: nothing is learned there).
    """

    d_out: int
    n_blocks: int = 0
    block: Optional[GrowingSpec] = None
    readout: GrowingSpec = GrowingSpec()
    capacity: int = DEFAULT_CAPACITY
    nonlinearity: Optional[Callable] = None
    normalize: bool = True
    replay_memory: bool = False

    @nn.compact
    def __call__(self, x):
        if self.n_blocks < 0:
            raise ConfigError(f"n_blocks must be >= 0, got {self.n_blocks}")
        norm = rms_norm if self.normalize else (lambda e: e)
        if self.replay_memory:      # rows of the inputs, for rehearsal only: its output reaches no loss
            GrowingLayer(self.block or self.readout, 1, self.capacity, name="replay")(norm(x))
        e = x
        for i in range(self.n_blocks):
            h = GrowingLayer(self.block or self.readout, e.shape[-1], self.capacity, name=f"block_{i}")(norm(e))
            e = e + (self.nonlinearity(h) if self.nonlinearity else h)
        return GrowingLayer(self.readout, self.d_out, self.capacity, name="readout")(norm(e))


class ScaledRMSNorm(nn.Module):
    """RMSNorm with a learned scale (the parametric baselines train it, F.2)."""

    @nn.compact
    def __call__(self, x):
        return rms_norm(x) * self.param("scale", nn.initializers.ones, (x.shape[-1],))


ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "softmax": lambda h: jax.nn.softmax(h, axis=-1)}


class ResidualMLP(nn.Module):
    """Eq. 12: ``e ← e + W2 σ(W1 RMSNorm(e))``, final RMSNorm and a linear readout.

    ``activation`` ∈ relu | gelu | softmax; ``hidden`` is the width of ``W1``.
    """

    d_out: int
    n_blocks: int = 2
    hidden: int = 256
    activation: str = "gelu"
    normalize: bool = True

    @nn.compact
    def __call__(self, x):
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        act = ACTIVATIONS[self.activation]
        norm = (lambda: ScaledRMSNorm()) if self.normalize else (lambda: (lambda e: e))
        e = x
        for _ in range(self.n_blocks):
            e = e + nn.Dense(e.shape[-1])(act(nn.Dense(self.hidden)(norm()(e))))
        return nn.Dense(self.d_out)(norm()(e))


class TeacherMLP(nn.Module):
    """The teacher of F.1.2 (and the reference student, wider): ``e = ReLU(W_in x)``,
    ``L-1`` blocks ``e ← e + ReLU(W e)``, ``y = W_out e``; LeCun-normal fan-in weights."""

    width: int = 100
    n_layers: int = 2
    d_out: int = 1
    use_bias: bool = False

    @nn.compact
    def __call__(self, x):
        dense = lambda n: nn.Dense(n, use_bias=self.use_bias, kernel_init=nn.initializers.lecun_normal())
        e = nn.relu(dense(self.width)(x))
        for _ in range(self.n_layers - 1):
            e = e + nn.relu(dense(self.width)(e))
        return dense(self.d_out)(e)


class ParametricSoftmax(nn.Module):
    """F.5: fixed-size keys ``K:(N, d_in)`` and values ``V:(N, d_out)`` trained by an optax
    optimizer; ``y = softmax(K RMSNorm(x) / (T √d_in)) V`` (unweighted, as in Table 6)."""

    width: int
    d_out: int
    temperature: float = 1.0

    @nn.compact
    def __call__(self, x):
        q = rms_norm(x)
        k = self.param("keys", nn.initializers.normal(1.0), (self.width, q.shape[-1]))
        v = self.param("values", nn.initializers.zeros, (self.width, self.d_out))
        # a parametric layer: every key is a trained parameter, so plain (unchunked) softmax
        a = (q @ k.T) / (self.temperature * math.sqrt(q.shape[-1]))
        return jax.nn.softmax(a, axis=-1) @ v


class ViT(nn.Module):
    """The vision transformer of App. F.11 (Tables 15, 16): non-overlapping ``patch × patch``
    patches embedded to ``d_e``, a CLS token, learned positional embeddings, ``n_blocks`` pre-LN
    blocks ``x ← x + MHA(LN(x))``, ``x ← x + FFN(LN(x))``, a final LayerNorm and a linear readout
    on the CLS token.

    ``ffn=None``: the standard FFN, ``Dense(d_e → blowup·d_e) → GELU → Dense(→ d_e)``. ``ffn`` a
    :class:`GrowingSpec`: every block's FFN is one growing layer of that spec (Table 16's growing
    weighted softmax, Alg. 3) applied to every token — each image adds ``tokens`` rows per block.
    Attention, norms, embeddings and readout stay parameters (trained by the trainer's ``tx``).
    Inputs are flattened images of ``image_shape`` (H, W, C).
    """

    d_out: int
    image_shape: Sequence[int]
    patch: int = 4
    d_e: int = 128
    heads: int = 8
    n_blocks: int = 2
    blowup: int = 4
    ffn: Optional[GrowingSpec] = None
    capacity: int = DEFAULT_CAPACITY

    @nn.compact
    def __call__(self, x):
        h, w, c = (int(v) for v in self.image_shape)
        p = self.patch
        if x.ndim != 2 or x.shape[-1] != h * w * c:
            raise ConfigError(f"ViT: expected flattened images of shape (B, {h * w * c}) for image_shape "
                              f"{tuple(self.image_shape)}, got {x.shape}")
        if h % p or w % p:
            raise ConfigError(f"ViT: patch {p} does not tile a {h}x{w} image; pick a divisor of both")
        if self.d_e % self.heads:
            raise ConfigError(f"ViT: d_e = {self.d_e} is not divisible by heads = {self.heads}")
        b = x.shape[0]
        img = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
        tok = nn.Dense(self.d_e, name="patch_embed")(img.reshape(b, (h // p) * (w // p), p * p * c))
        cls = self.param("cls", nn.initializers.zeros, (1, 1, self.d_e))
        e = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.d_e)), tok], axis=1)
        e = e + self.param("pos", nn.initializers.normal(0.02), e.shape[1:])
        n = e.shape[1]
        for i in range(self.n_blocks):
            a = nn.LayerNorm(name=f"ln_attn_{i}")(e)
            e = e + nn.MultiHeadDotProductAttention(num_heads=self.heads, name=f"attn_{i}")(a, a)
            f = nn.LayerNorm(name=f"ln_ffn_{i}")(e)
            if self.ffn is None:
                f = nn.Dense(self.d_e, name=f"ffn_out_{i}")(nn.gelu(nn.Dense(self.blowup * self.d_e,
                                                                             name=f"ffn_in_{i}")(f)))
            else:   # one growing layer over every token of the batch: (B·n, d_e) queries
                f = GrowingLayer(self.ffn, self.d_e, self.capacity, name=f"ffn_{i}")(
                    f.reshape(b * n, self.d_e)).reshape(b, n, self.d_e)
            e = e + f
        return nn.Dense(self.d_out, name="readout")(nn.LayerNorm(name="ln_final")(e)[:, 0])
