"""The training step: one forward pass, one backward pass, rows appended after.

Data flow of :func:`train_step` (DESIGN "The train step"):

1. forward: each growing layer gets ``q`` and returns ``s`` (sown, with a zero
   perturbation added to ``s``);
2. one backward pass gives ``g = ∂L/∂s`` for every growing layer (the gradient
   with respect to the perturbations) and the gradient of any parametric
   parameters (trained with optax);
3. each layer's rule turns ``(q, s, g)`` into candidate rows;
4. the rows are appended after the step, so every layer learns from the same
   forward pass (plain SGD semantics), and every memory's clock ``t`` advances.

:class:`Trainer` wraps this for the host: it grows the capacity of each memory
geometrically before a step needs it (so N rows cost O(log N) compilations).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.traverse_util import flatten_dict, unflatten_dict

from . import memory as memlib


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy; ``labels`` are integer classes ``(B,)``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def squared_error(pred, target):
    """Mean over the batch of ``‖y - y*‖²`` (so the per-sample gradient is ``2(s - y*)``)."""
    target = jnp.reshape(target, pred.shape)
    return jnp.mean(jnp.sum((pred - target) ** 2, axis=-1))


LOSSES = {"cross_entropy": cross_entropy, "squared_error": squared_error}


def get_loss(loss):
    if callable(loss):
        return loss
    try:
        return LOSSES[loss]
    except KeyError:
        raise ValueError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)} or pass a callable") from None


@struct.dataclass
class TrainState:
    """Everything a step reads and writes.

    ``collections`` holds the non-parametric variable collections of the model:
    ``"memory"`` (one :class:`Memory` per growing layer) and ``"frozen"`` (e.g. the
    ``W0`` of linear dual-form layers).
    """

    step: jax.Array
    params: Any
    collections: Any
    opt_state: Any


def memories(collections) -> Dict[tuple, memlib.Memory]:
    """``{module path: Memory}`` for every growing layer."""
    flat = flatten_dict(flax.core.unfreeze(collections.get("memory", {})))
    return {path[:-1]: m for path, m in flat.items() if isinstance(m, memlib.Memory)}


def _set_memories(collections, mems: Dict[tuple, memlib.Memory]):
    flat = flatten_dict(flax.core.unfreeze(collections["memory"]))
    for path in list(flat):
        if path[:-1] in mems:
            flat[path] = mems[path[:-1]]
    return {**collections, "memory": unflatten_dict(flat)}


def grow(collections, intermediates, g_tree, batch_size: int):
    """Append every layer's candidate rows; advance each memory's clock.

    ``intermediates`` and ``g_tree`` are the sown ``q``/``s`` and the gradients with
    respect to the ``"s"`` perturbations, keyed like the memory collection.
    """
    inter = flatten_dict(flax.core.unfreeze(intermediates))
    grads = flatten_dict(flax.core.unfreeze(g_tree))
    new = {}
    for path, mem in memories(collections).items():
        spec = mem.spec
        q = inter[path + ("q",)][0]
        s = inter[path + ("s",)][0]
        g = grads[path + ("s",)]
        if spec.grad_unit == "per_sample":
            g = g * batch_size  # the loss is a batch mean: ∂L/∂s_n = g_n / B
        rows = spec.candidate_rows(q, s, g)
        mem = memlib.append(mem, rows.w, rows.k, rows.v, born=mem.t + 1)
        new[path] = mem.replace(t=mem.t + 1)
    return _set_memories(collections, new) if new else collections


def train_step(model, loss_fn, tx, state: TrainState, x, y):
    """One step (pure; jit it with ``model``, ``loss_fn`` and ``tx`` static)."""
    variables = {"params": state.params, **state.collections}
    pert_shapes = jax.eval_shape(lambda: model.apply(variables, x, mutable=["perturbations"])[1])
    perts = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), pert_shapes.get("perturbations", {}))

    def objective(params, perts):
        out, aux = model.apply({**variables, "params": params, "perturbations": perts}, x,
                               mutable=["intermediates"])
        return loss_fn(out, y), (out, aux.get("intermediates", {}))

    (loss, (out, inter)), (g_params, g_perts) = jax.value_and_grad(
        objective, argnums=(0, 1), has_aux=True)(state.params, perts)
    params, opt_state = state.params, state.opt_state
    if tx is not None and jax.tree.leaves(params):
        updates, opt_state = tx.update(g_params, opt_state, params)
        params = optax.apply_updates(params, updates)
    collections = state.collections
    if "memory" in collections:
        collections = grow(collections, inter, g_perts, x.shape[0])
    new_state = state.replace(step=state.step + 1, params=params, collections=collections, opt_state=opt_state)
    return new_state, {"loss": loss}


class Trainer:
    """Host-side driver: initialises a model, grows capacity, runs jitted steps.

    >>> trainer = Trainer(model, loss="squared_error", sample_input=x0, rng=jax.random.key(0))
    >>> metrics = trainer.step(x, y)
    >>> y_hat = trainer.predict(x_test)
    """

    def __init__(self, model, *, loss="cross_entropy", tx: Optional[optax.GradientTransformation] = None,
                 sample_input=None, rng=None, variables=None, growth: float = 2.0):
        self.model = model
        self.loss_fn = get_loss(loss)
        self.tx = tx
        self.growth = growth
        if variables is None:
            if sample_input is None:
                raise ValueError("Trainer needs sample_input (a batch of inputs) to initialise the model")
            rng = jax.random.key(0) if rng is None else rng
            variables = model.init(rng, sample_input)
        variables = flax.core.unfreeze(variables)
        params = variables.pop("params", {})
        variables.pop("intermediates", None)
        variables.pop("perturbations", None)
        opt_state = tx.init(params) if tx is not None else None
        self.state = TrainState(step=jnp.zeros((), jnp.int32), params=params, collections=variables,
                                opt_state=opt_state)
        self._bound = {p: int(m.size) for p, m in memories(variables).items()}
        self._step = jax.jit(functools.partial(train_step, model, self.loss_fn, tx))
        self._predict = jax.jit(lambda v, x: model.apply(v, x))

    @property
    def variables(self):
        return {"params": self.state.params, **self.state.collections}

    def memories(self) -> Dict[tuple, memlib.Memory]:
        return memories(self.state.collections)

    def rows_in_use(self) -> Dict[str, int]:
        return {"/".join(p): int(m.size) for p, m in self.memories().items()}

    def ensure_capacity(self, extra: int):
        """Make room for ``extra`` more rows in every memory (syncs only when needed)."""
        mems = self.memories()
        changed = {}
        for path, mem in mems.items():
            if self._bound.get(path, 0) + extra > mem.capacity:
                exact = int(mem.size)
                self._bound[path] = exact
                if exact + extra > mem.capacity:
                    changed[path] = memlib.ensure_capacity(mem, extra, growth=self.growth)
        if changed:
            self.state = self.state.replace(collections=_set_memories(self.state.collections, changed))

    def step(self, x, y) -> Dict[str, float]:
        x = jnp.asarray(x)
        b = x.shape[0]
        self.ensure_capacity(b)
        self.state, metrics = self._step(self.state, x, jnp.asarray(y))
        for path in self._bound:
            self._bound[path] += b
        return metrics

    def predict(self, x, batch_size: int = 1024):
        outs = [self._predict(self.variables, jnp.asarray(x[i:i + batch_size]))
                for i in range(0, len(x), batch_size)]
        return jnp.concatenate(outs, axis=0)
