"""The paper's optimizers (Sec. 4, App. E) as optax transformations, and ``make(name, ...)``.

* **Mesa / FOOF** (App. E.2–E.4, Eqs. 116–121): each Dense kernel's gradient is
  preconditioned by the inverse of a running second moment of the layer's *inputs*.
* **Delta-rule GD** (App. E.1 and F.8.1, Eq. 122): gradient descent preceded by a
  forgetting of the weights along the batch's input directions.
* SGD, Adam, AdamW, RMSProp (optax) and Muon (``optax.contrib.muon``) through :func:`make`.

Conventions
-----------
The paper writes a linear layer as ``y = W x`` with ``W: (d_out, d_in)`` and a batch as
``X_T: (d_in, B)`` (inputs in columns). Flax's ``nn.Dense`` stores ``K = Wᵀ: (d_in, d_out)``
and computes ``y = x K`` on rows ``x: (B, d_in)``. With ``X`` the ``(B, d_in)`` rows here,
the paper's ``X_T X_Tᵀ`` is ``Xᵀ X`` and its ``∇_W L · M⁻¹`` (Eq. 117/121, ``M``
symmetric) is ``(M⁻¹ ∇_K L)ᵀ``: Mesa's update of a Flax kernel is ``K ← K − η M⁻¹ ∇_K L``
(the preconditioner acts on the input side, i.e. from the left on ``K``).

Only leaves named ``kernel`` with ``ndim == 2`` (Flax ``nn.Dense``) are preconditioned or
delta-decayed; every other leaf (biases, RMSNorm scales, other modules) gets the plain
gradient (which the base optimizer then scales). The paper does not say how it treats
biases; leaving them unpreconditioned is our choice.

Layer inputs
------------
Mesa and Delta need each Dense layer's batch inputs. Their ``update`` takes them as an
extra argument (an :class:`optax.GradientTransformationExtraArgs`)::

    updates, state = tx.update(grads, state, params, layer_inputs={("Dense_0",): x0, ...})

keyed by the module path of the Dense layer (the kernel's path in ``params`` without its
last ``"kernel"`` entry; ``"a/b"`` strings are accepted too). :func:`dense_inputs` runs any
Flax model and collects them (``flax.linen.intercept_methods`` on ``nn.Dense.__call__``:
no change to the model is needed); :func:`make_train_step` is a jitted step that does it.
Every optimizer returned by :func:`make` accepts (and the optax ones ignore) ``layer_inputs``.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, NamedTuple, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import optax.contrib

from .errors import ConfigError

__all__ = [
    "MesaState", "DeltaState", "newton_schulz_inverse", "scale_by_mesa", "mesa", "delta",
    "make", "OPTIMIZERS", "dense_inputs", "make_train_step", "dense_kernel_paths",
]

_HI = jax.lax.Precision.HIGHEST
LayerPath = Tuple[str, ...]

VARIANTS = ("cumulative", "static")
INVERSES = ("exact", "newton_schulz")
BASES = ("sgd", "adam")


# ----------------------------------------------------------------------------- paths

def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _leaf_path(path) -> LayerPath:
    return tuple(_key_name(k) for k in path)


def _is_dense_kernel(path: LayerPath, leaf) -> bool:
    return len(path) >= 1 and path[-1] == "kernel" and getattr(leaf, "ndim", 0) == 2


def dense_kernel_paths(params) -> Dict[str, LayerPath]:
    """``{"a/b": ("a", "b")}``: the module path of every 2-D ``kernel`` leaf of ``params``
    (the ``"params"`` collection of a Flax model) — the layers Mesa and Delta act on."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        p = _leaf_path(path)
        if _is_dense_kernel(p, leaf):
            out["/".join(p[:-1])] = p[:-1]
    return out


def _normalise_inputs(layer_inputs, who: str) -> Dict[str, jax.Array]:
    if layer_inputs is None:
        raise ConfigError(f"{who} needs layer_inputs={{dense module path: (B, d_in) inputs}} in update(); "
                          f"collect them with growmem.optim.dense_inputs (or use make_train_step)")
    out = {}
    for key, x in layer_inputs.items():
        name = key if isinstance(key, str) else "/".join(key)
        x = jnp.asarray(x)
        out[name] = x.reshape(-1, x.shape[-1])  # (…, d_in) -> (B, d_in)
    return out


def _inputs_for(inputs: Mapping[str, jax.Array], name: str, d_in: int, who: str) -> jax.Array:
    if name not in inputs:
        raise ConfigError(f"{who}: no layer_inputs for Dense layer {name!r} (have {sorted(inputs)}); "
                          f"pass the (B, d_in) inputs of every Dense layer")
    x = inputs[name]
    if x.shape[-1] != d_in:
        raise ConfigError(f"{who}: inputs of {name!r} have d_in={x.shape[-1]}, its kernel expects {d_in}")
    return x


def _map_kernels(fn, updates, params=None):
    """Apply ``fn(name, update_leaf, param_leaf)`` to Dense kernels, identity elsewhere."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
    pleaves = [None] * len(flat) if params is None else jax.tree_util.tree_leaves(params)
    out = []
    for (path, u), p in zip(flat, pleaves):
        lp = _leaf_path(path)
        out.append(fn("/".join(lp[:-1]), u, p) if _is_dense_kernel(lp, u) else None)
    return treedef, [u for _, u in flat], out


# ----------------------------------------------------------------------------- Newton–Schulz

def newton_schulz_inverse(M, steps: int, X0=None, *, precision=_HI):
    """``M⁻¹`` of an SPD ``M: (d, d)`` by ``steps`` Newton–Schulz iterations
    ``X_{k+1} = X_k (2I − M X_k)`` (Schulz 1933; F.7 / Table 8 use it for Eq. 121's inverse).

    ``X0`` defaults to ``I / ‖M‖_F``. The paper does not say how it initialises the
    iteration; with this scaled identity the residual ``E_k = I − M X_k`` equals
    ``(I − M/‖M‖_F)^{2^k}``: every eigen-component of the error shrinks monotonically
    (``0 ≤ 1 − μ/‖M‖_F < 1`` for each eigenvalue ``μ > 0``), slowly at first and
    quadratically once small — the pattern of Table 8 (5 steps < 10 ≈ exact). ``precision``
    of the matrix products (default HIGHEST: true fp32 on GPU/TPU). -> ``(d, d)``.
    """
    d = M.shape[-1]
    eye = jnp.eye(d, dtype=M.dtype)
    X = eye / jnp.linalg.norm(M) if X0 is None else X0
    for _ in range(int(steps)):
        X = jnp.matmul(X, 2.0 * eye - jnp.matmul(M, X, precision=precision), precision=precision)
    return X


# ----------------------------------------------------------------------------- Mesa / FOOF

class MesaState(NamedTuple):
    """``count`` steps taken; ``gamma_acc`` = Γ_T (Eq. 119); ``stats[layer]`` = Ψ_T (Eq. 120,
    ``variant="cumulative"``) or Φ_T (Alg. A, ``variant="static"``, λ terms included),
    ``(d_in, d_in)``."""

    count: jax.Array
    gamma_acc: jax.Array
    stats: Dict[str, jax.Array]


def scale_by_mesa(lam: float = 0.01, gamma: float = 0.99, *, variant: str = "cumulative",
                  inverse: str = "exact", ns_steps: int = 10,
                  precision=_HI) -> optax.GradientTransformationExtraArgs:
    """Mesa/FOOF preconditioning of every Dense kernel's gradient: ``G ↦ M_T⁻¹ G`` (no
    learning rate, no sign; chain it with a base optimizer — :func:`mesa` does).

    ``variant="cumulative"`` (Algorithm B, E.4.2 — "which we use in practice"), per layer
    with the batch inputs ``X: (B, d_in)``::

        Γ_T = γ Γ_{T-1} + 1                                       (Eq. 119)
        Ψ_T = (γ Γ_{T-1}/Γ_T) Ψ_{T-1} + Xᵀ X / (B d_in Γ_T)        (Eq. 120)
        M_T = Ψ_T + λ I                                            (Eq. 121)

    with ``Ψ_0 = 0, Γ_0 = 0``: ``Ψ_T`` is the γ-discounted average of ``XᵀX/(B d_in)``.

    ``variant="static"`` (Algorithm A, E.4.1 = FOOF), the un-normalised statistics::

        Φ_T = γ Φ_{T-1} + Xᵀ X + λ(1−γ) I,   Φ_0 = λ I,   M_T = Φ_T     (Eq. 116, Λ_T = λ)

    (the paper states Alg. A for batch size 1; a batch adds ``Σ_n x_n x_nᵀ = XᵀX``). With
    γ = 1, squared error summed over samples and η = 1, Alg. A makes a linear layer the
    exact ridge solution ``argmin Σ‖y − Wx‖² + λ‖W − W_0‖²`` of all batches so far
    (Eqs. 104–117 with ``C_0 = W_0``; with the batch-*mean* loss use η = B).

    ``inverse``: ``"exact"`` (Cholesky solve) or ``"newton_schulz"`` with ``ns_steps``
    iterations (:func:`newton_schulz_inverse`, started from ``I/‖M‖_F`` every step; Table 8
    compares 5, 10 and exact). ``precision`` of the statistics and Newton–Schulz products:
    HIGHEST (default) is true fp32; ``"default"`` lets GPUs use TF32 and TPUs bf16 passes.
    Measured on one H200 (Table 9 model: d = 3072, 5 Dense layers, B = 64): a step took
    22 ms with the exact solve; with 5 / 10 Newton–Schulz steps 71 / 136 ms at HIGHEST and
    11 / 22 ms at ``"default"`` (TF32; 10 steps then reach 2e-4 relative error, 2e-6 at
    HIGHEST) — the iteration only pays where the products run at reduced precision.

    Flax kernels ``K = Wᵀ: (d_in, d_out)``: the output is ``M_T⁻¹ ∇_K L`` (= ``(∇_W L M_T⁻¹)ᵀ``).
    ``update(updates, state, params=None, *, layer_inputs)`` (see the module docstring).
    """
    if variant not in VARIANTS:
        raise ConfigError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if inverse not in INVERSES:
        raise ConfigError(f"inverse must be one of {INVERSES}, got {inverse!r}")
    if not lam > 0:
        raise ConfigError(f"Mesa needs λ > 0 (the regulariser keeps M invertible), got {lam}")
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"Mesa forgetting factor γ must be in [0, 1], got {gamma}")
    if inverse == "newton_schulz" and int(ns_steps) < 0:
        raise ConfigError(f"ns_steps must be >= 0, got {ns_steps}")

    def init_fn(params):
        stats = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
            lp = _leaf_path(path)
            if _is_dense_kernel(lp, leaf):
                d = leaf.shape[0]
                name = "/".join(lp[:-1])
                # Ψ_0 = 0 (Eq. 120) | Φ_0 = Λ_0 I = λ I (Eq. 106)
                stats[name] = (jnp.zeros((d, d), jnp.float32) if variant == "cumulative"
                               else lam * jnp.eye(d, dtype=jnp.float32))
        return MesaState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32), stats)

    def update_fn(updates, state, params=None, *, layer_inputs=None, **extra):
        del params, extra
        inputs = _normalise_inputs(layer_inputs, "Mesa")
        gamma_acc = gamma * state.gamma_acc + 1.0                                   # Eq. 119
        stats = dict(state.stats)

        def precondition(name, g, _):
            d_in = g.shape[0]
            x = _inputs_for(inputs, name, d_in, "Mesa").astype(jnp.float32)
            xtx = jnp.matmul(x.T, x, precision=precision)                           # X_T X_Tᵀ
            eye = jnp.eye(d_in, dtype=jnp.float32)
            if variant == "cumulative":
                psi = (gamma * state.gamma_acc / gamma_acc) * state.stats[name] \
                    + xtx / (x.shape[0] * d_in * gamma_acc)                        # Eq. 120
                M = psi + lam * eye                                                 # Eq. 121
            else:
                psi = gamma * state.stats[name] + xtx + lam * (1.0 - gamma) * eye  # Alg. A
                M = psi
            stats[name] = psi
            g32 = g.astype(jnp.float32)
            if inverse == "exact":
                out = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(M, lower=True), g32)
            else:
                out = jnp.matmul(newton_schulz_inverse(M, ns_steps, precision=precision), g32, precision=precision)
            return out.astype(g.dtype)                                              # M_T⁻¹ ∇_K L

        treedef, leaves, new = _map_kernels(precondition, updates)
        missing = set(state.stats) - {n for n in dense_kernel_paths(updates)}
        if missing:
            raise ConfigError(f"Mesa: updates lack the Dense kernels {sorted(missing)} it was initialised with")
        out = [u if n is None else n for u, n in zip(leaves, new)]
        return (jax.tree_util.tree_unflatten(treedef, out),
                MesaState(state.count + 1, gamma_acc, stats))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def mesa(learning_rate, *, lam: float = 0.01, gamma: float = 0.99, variant: str = "cumulative",
         inverse: str = "exact", ns_steps: int = 10, precision=_HI, base: str = "sgd",
         momentum: float = 0.0, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformationExtraArgs:
    """The Mesa optimizer: :func:`scale_by_mesa` then a base optimizer with learning rate η.

    ``base="sgd"``, ``momentum=0`` is Eq. 121 as written, ``K ← K − η M_T⁻¹ ∇_K L``
    (``momentum > 0``: heavy-ball momentum on the preconditioned gradient).
    ``base="adam"`` feeds the preconditioned gradient to Adam with ``b1 = momentum``: our
    reading of Table 9 ("Optimizer Adam, Momentum 0.85", η ∈ {1e-4, …, 1e-2}); the paper does
    not spell out how Adam and Mesa combine. Non-Dense leaves get the base optimizer on
    their raw gradient. See :func:`scale_by_mesa` for λ, γ, ``variant``, ``inverse``.
    """
    if base not in BASES:
        raise ConfigError(f"mesa base must be one of {BASES}, got {base!r}")
    if base == "sgd":
        tail = optax.sgd(learning_rate, momentum=momentum or None)
    else:
        tail = optax.adam(learning_rate, b1=momentum, b2=b2, eps=eps)
    return optax.chain(scale_by_mesa(lam, gamma, variant=variant, inverse=inverse, ns_steps=ns_steps,
                                     precision=precision), tail)


# ----------------------------------------------------------------------------- Delta-rule GD

class DeltaState(NamedTuple):
    count: jax.Array


def delta(learning_rate, *, lam: float = 0.0) -> optax.GradientTransformationExtraArgs:
    """Delta-rule gradient descent (F.8.1, Eq. 122), all decays of a batch applied at once::

        W_t = W_{t-1} (I − λ η_t X_t X_tᵀ) − η_t G_{Y_t} X_t^T

    with ``X_t: (d_in, B)`` the batch inputs (``X_t X_tᵀ = Σ_n x_n x_nᵀ``, a *sum* over the
    batch, as in F.8.1) and ``G_{Y_t} X_tᵀ = ∇_W L`` the gradient of the training loss
    (so the batch-mean gradient under a mean loss). For a Flax kernel ``K = Wᵀ``:
    ``K ← K − η_t (∇_K L + λ XᵀX K)``, computed as ``Xᵀ(X K)`` (no ``d_in×d_in`` matrix).
    ``learning_rate`` is η_t (a float or an optax schedule); ``lam`` the decay rate λ
    (Table 10: 3e-7 … 3e-4). Non-Dense leaves: ``−η_t ∇``. ``lam=0`` is plain SGD.

    This is the parametrisation of Eq. 122 (decay aligned with the learning rate). Sec. 4 /
    Eq. 103 (write strength λ', target ``−η'∇_y L``) is ``learning_rate = λ'η'``,
    ``lam = 1/η'``; Delta Gradient Descent of *Nested Learning* (ref. 003, Eq. 57,
    ``W(I − η' x xᵀ) − η' ∇_W L``) is ``learning_rate = η'``, ``lam = 1`` with B = 1.
    ``update(updates, state, params, *, layer_inputs)`` — ``params`` are required.
    """
    if lam < 0:
        raise ConfigError(f"Delta decay rate λ must be >= 0, got {lam}")
    lr = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

    def init_fn(params):
        del params
        return DeltaState(jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None, *, layer_inputs=None, **extra):
        del extra
        if params is None:
            raise ConfigError("delta needs params in update() (the decay acts on the weights)")
        inputs = _normalise_inputs(layer_inputs, "Delta") if lam else {}
        eta = lr(state.count)

        def step(name, g, k):
            if not lam:
                return -eta * g
            x = _inputs_for(inputs, name, g.shape[0], "Delta").astype(k.dtype)
            decay = jnp.matmul(x.T, jnp.matmul(x, k, precision=_HI), precision=_HI)  # X Xᵀ applied to K
            return (-eta * (g + lam * decay)).astype(g.dtype)                          # Eq. 122

        treedef, leaves, new = _map_kernels(step, updates, params)
        out = [-eta * u if n is None else n for u, n in zip(leaves, new)]
        return jax.tree_util.tree_unflatten(treedef, out), DeltaState(state.count + 1)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# ----------------------------------------------------------------------------- make

#: name -> builder; the optax ones follow F.9 / Table 12 (Muon: ``optax.contrib.muon``,
#: whose non-matrix leaves go through AdamW, optax's own convention)
OPTIMIZERS: Dict[str, Callable[..., Any]] = {
    "sgd": optax.sgd,
    "adam": optax.adam,
    "adamw": optax.adamw,
    "rmsprop": optax.rmsprop,
    "muon": optax.contrib.muon,
    "mesa": mesa,
    "delta": delta,
}


def make(name: str, **hyper) -> optax.GradientTransformationExtraArgs:
    """``make("adam", learning_rate=1e-3)`` -> the optimizer ``name`` ∈ sgd | adam | adamw |
    rmsprop | muon | mesa | delta with its hyperparameters (the builder's keyword arguments;
    ``learning_rate`` is required). Every result accepts ``layer_inputs=`` in ``update``
    (Mesa and Delta need it, the others ignore it). Unknown names or hyperparameters raise
    ``ValueError`` naming the allowed ones."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    builder = OPTIMIZERS[name]
    allowed = set(inspect.signature(builder).parameters)
    unknown = set(hyper) - allowed
    if unknown:
        raise ConfigError(f"optimizer {name!r} takes hyperparameters {sorted(allowed)}, got unknown {sorted(unknown)}")
    if "learning_rate" not in hyper:
        raise ConfigError(f"optimizer {name!r} needs learning_rate")
    return optax.with_extra_args_support(builder(**hyper))


# ----------------------------------------------------------------------------- training

def dense_inputs(model: nn.Module, variables, *args, **kwargs):
    """Run ``model.apply(variables, *args, **kwargs)`` and collect the input of every
    ``nn.Dense`` call. -> ``(output, {module path: (B, d_in) inputs})`` (gradients stopped;
    extra leading axes flattened into B; a layer called twice gets its inputs concatenated).
    The keys are the module paths Mesa and Delta expect in ``layer_inputs``."""
    got: Dict[LayerPath, list] = {}

    def interceptor(next_fun, a, kw, context):
        if isinstance(context.module, nn.Dense) and context.method_name == "__call__":
            x = a[0] if a else kw["inputs"]
            got.setdefault(tuple(context.module.path), []).append(
                jax.lax.stop_gradient(x.reshape(-1, x.shape[-1])))
        return next_fun(*a, **kw)

    with nn.intercept_methods(interceptor):
        out = model.apply(variables, *args, **kwargs)
    return out, {k: v[0] if len(v) == 1 else jnp.concatenate(v, axis=0) for k, v in got.items()}


def make_train_step(model: nn.Module, loss_fn: Callable, tx: optax.GradientTransformation):
    """A jitted ``step(params, opt_state, x, y) -> (params, opt_state, loss)`` for a
    parametric Flax model (``params`` = its ``"params"`` collection) that passes the Dense
    inputs of the forward pass to ``tx.update(..., layer_inputs=...)``, as Mesa and Delta
    need (``loss_fn(output, y) -> scalar``). Initialise with ``tx.init(params)``."""
    tx = optax.with_extra_args_support(tx)

    @jax.jit
    def step(params, opt_state, x, y):
        def objective(p):
            out, inputs = dense_inputs(model, {"params": p}, x)
            return loss_fn(out, y), inputs

        (loss, inputs), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params, layer_inputs=inputs)
        return optax.apply_updates(params, updates), opt_state, loss

    return step
