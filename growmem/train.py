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

A layer whose spec has a ``policy`` grows through :func:`growmem.policies.step` (admit,
age, evict, append); a ``hybrid`` layer (Alg. 4) also gets the gradient of the loss with
respect to its stored rows from the same backward pass, and the trainer's ``hybrid_tx``
(Adam by default) updates them, with ``w`` projected back to ``w ≥ 0``.

:class:`Trainer` wraps this for the host: it grows the capacity of each memory
geometrically before a step needs it (so N rows cost O(log N) compilations).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, NamedTuple, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.traverse_util import flatten_dict, unflatten_dict

from . import memory as memlib
from . import policies as polib


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
    #: ``{"layer/path": state}`` of each growing layer that has a policy
    policy_state: Any = None
    #: ``{"layer/path": optax state}`` of each hybrid layer's stored rows
    hybrid_state: Any = None


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


def layer_key(path) -> str:
    """The key of a layer in ``policy_state`` / ``hybrid_state``: its module path joined by '/'."""
    return "/".join(path)


def grow(collections, intermediates, g_tree, batch_size: int):
    """Append every layer's candidate rows; advance each memory's clock.

    ``intermediates`` and ``g_tree`` are the sown ``q``/``s`` and the gradients with
    respect to the ``"s"`` perturbations, keyed like the memory collection. Layers with a
    policy use the policy's initial state here; :func:`grow_step` carries policy state and
    hybrid updates.
    """
    return grow_step(collections, intermediates, g_tree, batch_size)[0]


def _row_params(mem: memlib.Memory) -> dict:
    return {"w": mem.w, "k": mem.k, "v": mem.v}


def hybrid_update(tx, mem: memlib.Memory, grads: dict, opt_state):
    """One optimizer step on the stored rows (Alg. 4 line 10); ``w ≥ 0`` by projection.

    ``grads`` holds ``∂L/∂w, ∂L/∂k, ∂L/∂ṽ`` for the whole capacity; rows past ``size``
    have zero gradient, so they stay zero under Adam/SGD-style optimizers.
    """
    params = _row_params(mem)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    w = params["w"]
    if mem.spec.kernel == "weighted_softmax":
        w = jnp.maximum(w, 0.0)  # projected step: keep the weights non-negative (den > 0)
    return mem.replace(w=w, k=params["k"], v=params["v"]), opt_state


def _rows_tree_map(fn, tree, capacity: int):
    """Apply ``fn`` to the leaves of an optimizer state that are per-row (leading dim = capacity)."""
    return jax.tree.map(lambda a: fn(a) if getattr(a, "ndim", 0) >= 1 and a.shape[0] == capacity else a, tree)


def compact_rows(tree, keep, size, capacity: int):
    """Compact the per-row leaves of ``tree`` like :func:`growmem.memory.select` compacts rows."""
    changed = jnp.any((jnp.arange(capacity) < size) & ~keep)
    move = lambda t: _rows_tree_map(memlib.compact_fn(keep, size), t, capacity)
    return jax.lax.cond(changed, move, lambda t: t, tree)


def pad_rows(tree, old: int, new: int):
    """Pad the per-row leaves of ``tree`` from ``old`` to ``new`` rows (capacity growth)."""
    return _rows_tree_map(lambda a: jnp.pad(a, [(0, new - old)] + [(0, 0)] * (a.ndim - 1)), tree, old)


def grow_step(collections, intermediates, g_tree, batch_size: int, *, policy_state=None,
              row_grads=None, hybrid_tx=None, hybrid_state=None):
    """:func:`grow` with policies and hybrid updates: ``-> (collections, policy_state, hybrid_state)``.

    ``row_grads`` is ``{layer key: {"w", "k", "v"}}`` (gradients of the loss with respect to
    the stored rows of hybrid layers), ``hybrid_state`` their optimizer states.
    """
    inter = flatten_dict(flax.core.unfreeze(intermediates))
    grads = flatten_dict(flax.core.unfreeze(g_tree))
    policy_state = dict(policy_state or {})
    hybrid_state = dict(hybrid_state or {})
    new = {}
    for path, mem in memories(collections).items():
        spec = mem.spec
        q = inter[path + ("q",)][0]
        s = inter[path + ("s",)][0]
        g = grads[path + ("s",)]
        if spec.grad_unit == "per_sample":
            g = g * batch_size  # the loss is a batch mean: ∂L/∂s_n = g_n / B
        rows = spec.candidate_rows(q, s, g)
        if spec.policy is None and not spec.hybrid:
            mem = memlib.append(mem, rows.w, rows.k, rows.v, born=mem.t + 1)
            new[path] = mem.replace(t=mem.t + 1)
            continue
        key = layer_key(path)
        pol = spec.policy or polib.identity()
        pstate = policy_state[key] if key in policy_state else pol.init(mem)
        update_rows = None
        if spec.hybrid:
            if hybrid_tx is None or row_grads is None or key not in hybrid_state:
                raise ValueError(f"layer {key} is hybrid: grow_step needs hybrid_tx, row_grads and "
                                 f"hybrid_state (use Trainer, which provides them)")
            update_rows = functools.partial(hybrid_update, hybrid_tx, grads=row_grads[key],
                                            opt_state=hybrid_state[key])
        size_before = mem.size
        res = polib.step(pol, mem, rows, pstate, update_rows=update_rows)
        if spec.policy is not None:
            policy_state[key] = res.state
        if spec.hybrid:
            hybrid_state[key] = compact_rows(res.aux, res.keep, size_before, mem.capacity)
        new[path] = res.mem
    collections = _set_memories(collections, new) if new else collections
    # empty -> None, as the Trainer stores them (keeps the jitted step's pytree structure fixed)
    return collections, policy_state or None, hybrid_state or None


def _with_rows(collections, rows: Dict[str, dict]):
    """``collections`` with the stored rows of the given layers replaced (for differentiation)."""
    if not rows:
        return collections
    mems = {path: m.replace(**rows[layer_key(path)]) for path, m in memories(collections).items()
            if layer_key(path) in rows}
    return _set_memories(collections, mems)


class StepGrads(NamedTuple):
    """What one forward and one backward pass give (steps 1–2 of the module docstring)."""

    loss: jax.Array
    intermediates: Any     # the sown q, s of every growing layer
    g: Any                 # ∂L/∂s of every growing layer (the gradients of the "s" perturbations)
    g_params: Any          # ∂L/∂params of the parametric parameters
    row_grads: Any         # {layer key: ∂L/∂(w, k, ṽ)} of hybrid layers' stored rows, or None


def step_gradients(model, loss_fn, state: TrainState, x, y) -> StepGrads:
    """Steps 1–2: forward, one backward pass. Reads ``state``, changes nothing (pure)."""
    variables = {"params": state.params, **state.collections}
    pert_shapes = jax.eval_shape(lambda: model.apply(variables, x, mutable=["perturbations"])[1])
    perts = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), pert_shapes.get("perturbations", {}))
    hybrid_rows = {layer_key(p): _row_params(m) for p, m in memories(state.collections).items()
                   if m.spec.hybrid}

    def objective(params, perts, rows=None):
        colls = _with_rows(state.collections, rows) if rows else state.collections
        out, aux = model.apply({**variables, **colls, "params": params, "perturbations": perts}, x,
                               mutable=["intermediates"])
        return loss_fn(out, y), aux.get("intermediates", {})

    row_grads = None
    if hybrid_rows:
        (loss, inter), (g_params, g_perts, row_grads) = jax.value_and_grad(
            objective, argnums=(0, 1, 2), has_aux=True)(state.params, perts, hybrid_rows)
    else:
        (loss, inter), (g_params, g_perts) = jax.value_and_grad(
            objective, argnums=(0, 1), has_aux=True)(state.params, perts)
    return StepGrads(loss, inter, g_perts, g_params, row_grads)


def apply_step(tx, state: TrainState, grads: StepGrads, batch_size: int, hybrid_tx=None):
    """Steps 3–5: the optax update of the parameters, the rows appended under each layer's
    policy (and the hybrid update), ``step += 1``. ``-> (state, {"loss": loss})`` (pure)."""
    params, opt_state = state.params, state.opt_state
    if tx is not None and jax.tree.leaves(params):
        updates, opt_state = tx.update(grads.g_params, opt_state, params)
        params = optax.apply_updates(params, updates)
    collections = state.collections
    policy_state, hybrid_state = state.policy_state, state.hybrid_state
    if "memory" in collections:
        if policy_state is None and hybrid_state is None:
            collections = grow(collections, grads.intermediates, grads.g, batch_size)
        else:
            collections, policy_state, hybrid_state = grow_step(
                collections, grads.intermediates, grads.g, batch_size, policy_state=policy_state,
                row_grads=grads.row_grads, hybrid_tx=hybrid_tx, hybrid_state=hybrid_state)
    new_state = state.replace(step=state.step + 1, params=params, collections=collections, opt_state=opt_state,
                              policy_state=policy_state, hybrid_state=hybrid_state)
    return new_state, {"loss": grads.loss}


def train_step(model, loss_fn, tx, state: TrainState, x, y, hybrid_tx=None):
    """One step (pure; jit it with ``model``, ``loss_fn``, ``tx`` and ``hybrid_tx`` static):
    :func:`step_gradients` then :func:`apply_step`.

    :class:`Trainer` runs the two halves as two jitted programs, the second one donating the
    state: in one program XLA copies every row table before the in-place append (its reads
    by retrieval come first), which cost 1.4× per step at 19k rows, d = 784.
    """
    return apply_step(tx, state, step_gradients(model, loss_fn, state, x, y), x.shape[0], hybrid_tx=hybrid_tx)


class Trainer:
    """Host-side driver: initialises a model, grows capacity, runs jitted steps.

    >>> trainer = Trainer(model, loss="squared_error", sample_input=x0, rng=jax.random.key(0))
    >>> metrics = trainer.step(x, y)
    >>> y_hat = trainer.predict(x_test)
    """

    def __init__(self, model, *, loss="cross_entropy", tx: Optional[optax.GradientTransformation] = None,
                 sample_input=None, rng=None, variables=None, growth: float = 2.0,
                 hybrid_tx: Optional[optax.GradientTransformation] = None, donate: bool = True):
        """``hybrid_tx`` trains the stored rows of hybrid layers (default ``optax.adam(1e-3)``).

        ``donate``: each step consumes the previous ``trainer.state`` so rows are appended in
        place instead of copying every memory; keep a copy (``jax.tree.map(jnp.copy,
        trainer.state)``) to step again from an old state, or pass ``donate=False``.
        """
        self.model = model
        self.loss_fn = get_loss(loss)
        self.tx = tx
        if growth <= 1.0:
            raise ValueError(f"growth factor must be > 1, got {growth}")
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
        mems = memories(variables)
        policy_state = {layer_key(p): m.spec.policy.init(m) for p, m in mems.items() if m.spec.policy is not None}
        hybrid = {layer_key(p): m for p, m in mems.items() if m.spec.hybrid}
        if hybrid and hybrid_tx is None:
            hybrid_tx = optax.adam(1e-3)
        self.hybrid_tx = hybrid_tx
        hybrid_state = {k: hybrid_tx.init(_row_params(m)) for k, m in hybrid.items()}
        self.state = TrainState(step=jnp.zeros((), jnp.int32), params=params, collections=variables,
                                opt_state=opt_state, policy_state=policy_state or None,
                                hybrid_state=hybrid_state or None)
        self._bound = {p: int(m.size) for p, m in mems.items()}
        #: :class:`growmem.storage.spill.Spill` once :meth:`enable_spill` was called
        self.spill = None
        #: :class:`growmem.storage.sharded.RowShards` once :meth:`enable_sharding` was called
        self.shards = None
        #: per-layer upper bound on the hot capacity (set by spilling)
        self._capacity_limit: Dict[tuple, int] = {}
        # two programs: gradients (reads the state), then the update (consumes it, so rows are appended
        # in place); in one program XLA would copy every row table before the append (train_step)
        self._grads = jax.jit(functools.partial(step_gradients, model, self.loss_fn))
        self._apply = jax.jit(functools.partial(apply_step, tx, hybrid_tx=hybrid_tx), static_argnums=2,
                              donate_argnums=0 if donate else ())
        self._predict = jax.jit(lambda v, x: model.apply(v, x))

    @property
    def variables(self):
        return {"params": self.state.params, **self.state.collections}

    def memories(self) -> Dict[tuple, memlib.Memory]:
        return memories(self.state.collections)

    def enable_spill(self, directory, *, ram_budget_bytes: int, **kwargs):
        """Keep at most ``ram_budget_bytes`` of rows in RAM; older rows spill to TensorStore
        (zarr v3) tiers under ``directory`` (a path or a TensorStore kvstore URL), one per layer.
        Training and prediction still see every row. Returns the
        :class:`growmem.storage.spill.Spill` (keyword arguments: ``chunk_rows``, ``read_ahead``,
        ``compact_every``, ``overwrite``, and ``resume=True`` to reopen the tiers of a run before
        restoring its checkpoint)."""
        from .storage.spill import Spill

        if self.spill is not None:
            raise ValueError(f"this trainer already spills to {self.spill.directory}")
        if self.shards is not None:
            raise ValueError("this trainer's memories are sharded over a device mesh; spilling a sharded memory "
                             "to disk is not supported — use one or the other")
        return Spill(self, directory, ram_budget_bytes=ram_budget_bytes, **kwargs)

    def enable_sharding(self, mesh=None, axis: str = "rows"):
        """Shard every growing layer's rows along their axis over ``mesh`` (default: all devices).

        Each device holds ``1/S`` of every memory's capacity; retrieval and novelty search
        run per shard and merge (:class:`growmem.storage.sharded.RowShards`); everything
        else in the state is replicated. Results equal the unsharded trainer's up to float
        rounding. Single process (on a CPU host, force several devices with
        ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before importing JAX); a
        sharded memory across processes is :class:`growmem.storage.sharded.ShardedMemory`.
        """
        from .storage.sharded import RowShards, row_mesh

        if self.spill is not None:
            raise ValueError("this trainer spills to disk; a sharded memory that also spills is not supported")
        if jax.process_count() > 1:
            raise ValueError("Trainer.enable_sharding runs in a single process; across processes use "
                             "growmem.storage.sharded.ShardedMemory (jax.distributed)")
        mesh = row_mesh(axis=axis) if mesh is None else mesh
        shards = RowShards(mesh, axis)
        if memlib.ROW_QUANTUM % shards.n_shards:
            raise ValueError(f"a mesh axis of {shards.n_shards} devices does not divide the row quantum "
                             f"{memlib.ROW_QUANTUM}: use a power of two")
        self.shards = shards
        self.state = self._place(self.state)
        return shards

    def _place(self, state):
        """Memories sharded along rows, every other leaf replicated over the trainer's mesh."""
        rep = self.shards.replicated()

        def put(x):
            if memlib.is_memory(x):
                return self.shards.place(x)
            return jax.device_put(x, rep) if isinstance(x, (jax.Array, np.ndarray)) else x

        return jax.tree.map(put, state, is_leaf=memlib.is_memory)

    def set_state(self, state: TrainState):
        """Install ``state`` (e.g. a restored checkpoint) and reset the host-side row bounds."""
        if self.shards is not None:
            state = self._place(state)
        self.state = state
        self._bound = {p: int(m.size) for p, m in memories(state.collections).items()}

    def rows_in_use(self) -> Dict[str, int]:
        """Rows of every layer, ``{"layer/path": n}``: in RAM plus, when spilling, on disk."""
        out = self.hot_rows()
        if self.spill is not None:
            for path, store in self.spill.stores.items():
                out["/".join(path)] += store.rows
        return out

    def hot_rows(self) -> Dict[str, int]:
        """Rows of every layer held in memory (all of them unless spilling)."""
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
                    target = max(exact + extra, int(np.ceil(mem.capacity * self.growth)))
                    if path in self._capacity_limit:  # spilling keeps the hot rows within the budget
                        target = max(exact + extra, min(target, self._capacity_limit[path]))
                    changed[path] = memlib.with_capacity(mem, target)
        if changed:
            if self.shards is not None:
                changed = {p: self.shards.place(m) for p, m in changed.items()}
            hybrid_state = self.state.hybrid_state
            if hybrid_state:
                hybrid_state = dict(hybrid_state)
                for path, m in changed.items():
                    if layer_key(path) in hybrid_state:
                        hybrid_state[layer_key(path)] = pad_rows(hybrid_state[layer_key(path)],
                                                                 mems[path].capacity, m.capacity)
            self.state = self.state.replace(collections=_set_memories(self.state.collections, changed),
                                            hybrid_state=hybrid_state)
            if self.shards is not None and hybrid_state:
                self.state = self.state.replace(hybrid_state=self._place(hybrid_state))

    def step(self, x, y) -> Dict[str, float]:
        x = jnp.asarray(x)
        b = x.shape[0]
        if self.spill is not None:
            self.spill.before_step(b)
        self.ensure_capacity(b)
        self.state, metrics = self._apply(self.state, self._grads(self.state, x, jnp.asarray(y)), b)
        for path in self._bound:
            self._bound[path] += b
        return metrics

    def predict(self, x, batch_size: int = 1024):
        outs = [self._predict(self.variables, jnp.asarray(x[i:i + batch_size]))
                for i in range(0, len(x), batch_size)]
        return jnp.concatenate(outs, axis=0)
