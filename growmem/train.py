"""The training step — one forward pass, one backward pass, rows appended after — the
:class:`Trainer` that drives it, and :func:`fit`, the one training loop.

Data flow of :func:`train_step` (DESIGN "The train step"):

1. forward: each growing layer gets ``q`` and returns ``s`` (sown, with a zero
   perturbation added to ``s``);
2. one backward pass gives ``g = ∂L/∂s`` for every growing layer (the gradient
   with respect to the perturbations), the gradient of any parametric parameters
   (trained with optax) and, for layers whose policy trains the stored rows (hybrid,
   Alg. 4), the gradient with respect to those rows;
3. each layer's rule turns ``(q, s, g)`` into candidate rows;
4. each layer's policy admits, trains, ages and evicts (:func:`growmem.policies.step`);
   the rows are appended after the step, so every layer learns from the same forward
   pass (plain SGD semantics), and every memory's clock ``t`` advances.

Where each memory's rows live is its backend's business (:mod:`growmem.backends`): the
trainer asks it to make room before a step (grow the capacity geometrically, so N rows cost
O(log N) compilations; spill to disk past a RAM budget) and never looks at the rows itself.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax import lax
from flax.traverse_util import flatten_dict, unflatten_dict

from . import backends
from . import memory as memlib
from . import policies as polib
from .errors import ConfigError, NumericalError, WrongTypeError


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy; ``labels`` are integer classes ``(B,)``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def squared_error(pred, target):
    """Mean over the batch of ``‖y - y*‖²`` (so the per-sample gradient is ``2(s - y*)``)."""
    target = jnp.reshape(target, pred.shape)
    return jnp.mean(jnp.sum((pred - target) ** 2, axis=-1))


def cross_entropy_present(logits, labels):
    """Mean softmax cross-entropy over the classes present in the batch only (the "labels trick" of
    Zeno et al., 2018): a class absent from the batch gets no gradient, so a growing layer's new rows
    (``ṽ = −βg``) write no negative values onto the classes of earlier experiences."""
    present = jnp.any(jax.nn.one_hot(labels, logits.shape[-1], dtype=bool), axis=0)
    masked = jnp.where(present[None, :], logits, jnp.finfo(logits.dtype).min / 2)
    return optax.softmax_cross_entropy_with_integer_labels(masked, labels).mean()


def onehot_squared_error(pred, labels):
    """Mean over the batch of ``½‖s − e_y‖²`` for integer classes ``y``: the per-sample gradient is
    ``s − e_y``, so the ``target`` rule (``ṽ = s − g``) stores the one-hot label itself — a Nadaraya–Watson
    readout of the targets inside a network whose other layers learn from its error."""
    return 0.5 * jnp.mean(jnp.sum((pred - jax.nn.one_hot(labels, pred.shape[-1], dtype=pred.dtype)) ** 2, axis=-1))


LOSSES = {"cross_entropy": cross_entropy, "cross_entropy_present": cross_entropy_present,
          "squared_error": squared_error, "onehot_squared_error": onehot_squared_error}
#: losses over integer class labels (their labels are checked against the model's classes)
CLASS_LOSSES = (cross_entropy, cross_entropy_present, onehot_squared_error)


def get_loss(loss):
    if callable(loss):
        return loss
    try:
        return LOSSES[loss]
    except KeyError:
        raise ConfigError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)} or pass a callable") from None


@struct.dataclass
class TrainState:
    """Everything a step reads and writes.

    ``collections`` holds the non-parametric variable collections of the model:
    ``"memory"`` (one :class:`Memory` per growing layer) and ``"frozen"`` (e.g. the
    ``W0`` of linear dual-form layers). ``policy_state`` is ``{"layer/path": state}`` of every
    growing layer that has a policy (None when no layer has one).
    """

    step: jax.Array
    params: Any
    collections: Any
    opt_state: Any
    policy_state: Any = None


def memories(collections) -> Dict[tuple, memlib.Memory]:
    """``{module path: Memory}`` for every growing layer."""
    flat = flatten_dict(flax.core.unfreeze(collections.get("memory", {})))
    return {path[:-1]: m for path, m in flat.items() if isinstance(m, memlib.Memory)}


def set_memories(collections, mems: Dict[tuple, memlib.Memory]):
    """``collections`` with the given layers' memories replaced."""
    flat = flatten_dict(flax.core.unfreeze(collections["memory"]))
    for path in list(flat):
        if path[:-1] in mems:
            flat[path] = mems[path[:-1]]
    return {**collections, "memory": unflatten_dict(flat)}


def layer_key(path) -> str:
    """The key of a layer in ``policy_state``: its module path joined by '/'."""
    return "/".join(path)


def rows_per_input(model, variables, x) -> Dict[tuple, int]:
    """``{layer path: rows per input}``: how many candidate rows each growing layer proposes for
    one input of ``x`` (1 for an MLP; a ViT's FFN sees every token of an image). Abstract: no
    compute, only shapes."""
    return _probe(model, variables, x)[1]


def _probe(model, variables, x):
    """One abstract forward pass of ``x``: ``(output shape-dtype, rows per input)``."""
    x = jnp.asarray(x)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ConfigError(f"need a non-empty batch of inputs to size the memories, got shape {x.shape}")
    varis = {k: v for k, v in variables.items() if k not in ("intermediates", "perturbations")}
    out, upd = jax.eval_shape(lambda: model.apply(varis, x, mutable=["intermediates"]))
    inter = flatten_dict(flax.core.unfreeze(upd.get("intermediates", {})))
    per_input = {}
    for path in memories(varis):
        q = inter.get(path + ("q",))
        n = 1 if q is None else int(q[0].shape[0])
        if q is not None and n % x.shape[0]:
            raise ConfigError(f"layer {layer_key(path)} proposes {n} rows for a batch of {x.shape[0]} inputs: "
                              f"a growing layer must see a whole number of queries per input")
        per_input[path] = max(1, n // x.shape[0]) if q is not None else 1
    return out, per_input


def _row_params(mem: memlib.Memory) -> dict:
    return {"w": mem.w, "k": mem.k, "v": mem.v}


def finite_rows(rows) -> jax.Array:
    """``(B,)`` bool: candidate rows whose ``w``, ``k`` and ``v`` are all finite (:func:`memory.finite_rows`)."""
    return memlib.finite_rows(jnp.asarray(rows.w), jnp.asarray(rows.k), jnp.asarray(rows.v))


def bad_samples(oks, batch_size: int) -> jax.Array:
    """``(B,)`` bool: the samples with a non-finite candidate row in any layer. ``oks``: each
    layer's ``(B · rows per input,)`` finite-row mask, a sample's rows consecutive (layers whose
    row count is not a multiple of ``B`` are left out)."""
    bad = jnp.zeros((batch_size,), bool)
    for ok in oks:
        if ok.shape[0] % batch_size == 0:
            bad = bad | ~jnp.all(ok.reshape(batch_size, -1), axis=1)
    return bad


def grow(collections, intermediates, g_tree, batch_size: int, *, policy_state=None, row_grads=None, targets=None,
         replayed=None):
    """Steps 3–4 for every growing layer: ``-> (collections, policy_state, dropped)``.

    ``intermediates`` and ``g_tree`` are the sown ``q``/``s`` and the gradients with respect to
    the ``"s"`` perturbations, keyed like the memory collection; a layer's policy (installed in
    its memory) runs with its state from ``policy_state`` (its ``init`` state when absent);
    ``row_grads`` is ``{layer key: {"w", "k", "v"}}`` for layers whose policy trains rows; ``targets`` (the
    batch's) and ``replayed`` (``(B,)``: the samples :class:`SelfReplay` added) reach the policies of layers
    with one candidate row per input.

    A candidate row that is not finite (a NaN or inf input, an overflowing rule) never enters
    a memory, whatever the policy, and neither do the other rows of its sample: a NaN target
    makes only the rows of the layers its gradient reaches non-finite (none below a memory
    that is still empty), yet the sample is bad in every layer. ``dropped`` counts the rows
    refused over all layers (int32).
    """
    inter = flatten_dict(flax.core.unfreeze(intermediates))
    grads = flatten_dict(flax.core.unfreeze(g_tree))
    policy_state = dict(policy_state or {})
    new = {}
    dropped = jnp.zeros((), jnp.int32)
    layers = []
    for path, mem in memories(collections).items():
        q = inter[path + ("q",)][0]
        s = inter[path + ("s",)][0]
        g = grads[path + ("s",)]
        if mem.spec.grad_unit == "per_sample":
            g = g * batch_size  # the loss is a batch mean: ∂L/∂s_n = g_n / B
        rows = mem.spec.candidate_rows(q, s, g)
        layers.append((path, mem, rows, finite_rows(rows)))
    bad = bad_samples([ok for *_, ok in layers], batch_size)
    for path, mem, rows, ok in layers:
        pol = mem.policy
        if ok.shape[0] % batch_size == 0:
            ok = ok & ~jnp.repeat(bad, ok.shape[0] // batch_size)
        dropped = dropped + jnp.sum(~ok, dtype=jnp.int32)
        key = layer_key(path)
        if pol is None:
            mem = backends.of(mem).append(mem, rows.w, rows.k, rows.v, mem.t + 1, ok)
            new[path] = mem.replace(t=mem.t + 1)
            continue
        state = policy_state[key] if key in policy_state else pol.init(mem)
        per_row = rows.w.shape[0] == batch_size
        res = polib.step(pol, mem, rows, state, grads=(row_grads or {}).get(key), mask=ok,
                         targets=targets if per_row else None, replayed=replayed if per_row else None)
        policy_state[key] = res.state
        new[path] = res.mem
    collections = set_memories(collections, new) if new else collections
    # empty -> None, as the Trainer stores it (keeps the jitted step's pytree structure fixed)
    return collections, policy_state or None, dropped


def _with_rows(collections, rows: Dict[str, dict]):
    """``collections`` with the stored rows of the given layers replaced (for differentiation)."""
    if not rows:
        return collections
    mems = {path: m.replace(**rows[layer_key(path)]) for path, m in memories(collections).items()
            if layer_key(path) in rows}
    return set_memories(collections, mems)


class StepGrads(NamedTuple):
    """What one forward and one backward pass give (steps 1–2 of the module docstring)."""

    loss: jax.Array
    intermediates: Any     # the sown q, s of every growing layer
    g: Any                 # ∂L/∂s of every growing layer (the gradients of the "s" perturbations)
    g_params: Any          # ∂L/∂params of the parametric parameters
    row_grads: Any         # {layer key: ∂L/∂(w, k, ṽ)} of layers whose policy trains rows, or None
    targets: Any = None    # the batch's targets (policies that keep per-row labels read them)
    replayed: Any = None   # (B,) the samples SelfReplay added to the batch, or None


def step_gradients(model, loss_fn, state: TrainState, x, y) -> StepGrads:
    """Steps 1–2: forward, one backward pass. Reads ``state``, changes nothing (pure)."""
    variables = {"params": state.params, **state.collections}
    pert_shapes = jax.eval_shape(lambda: model.apply(variables, x, mutable=["perturbations"])[1])
    perts = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), pert_shapes.get("perturbations", {}))
    trained = {layer_key(p): _row_params(m) for p, m in memories(state.collections).items()
               if m.policy is not None and m.policy.trains_rows}

    def objective(params, perts, rows=None):
        colls = _with_rows(state.collections, rows) if rows else state.collections
        out, aux = model.apply({**variables, **colls, "params": params, "perturbations": perts}, x,
                               mutable=["intermediates"])
        return loss_fn(out, y), aux.get("intermediates", {})

    row_grads = None
    if trained:
        (loss, inter), (g_params, g_perts, row_grads) = jax.value_and_grad(
            objective, argnums=(0, 1, 2), has_aux=True)(state.params, perts, trained)
    else:
        (loss, inter), (g_params, g_perts) = jax.value_and_grad(
            objective, argnums=(0, 1), has_aux=True)(state.params, perts)
    return StepGrads(loss, inter, g_perts, g_params, row_grads, y)


def apply_step(tx, state: TrainState, grads: StepGrads, batch_size: int):
    """Steps 3–4: the optax update of the parameters, every layer's rows under its policy,
    ``step += 1``. ``-> (state, {"loss": loss, "dropped_rows": n})`` (pure; ``dropped_rows``:
    candidate rows refused because they were not finite)."""
    params, opt_state = state.params, state.opt_state
    if tx is not None and jax.tree.leaves(params):
        updates, opt_state = tx.update(grads.g_params, opt_state, params)
        params = optax.apply_updates(params, updates)
    collections, policy_state = state.collections, state.policy_state
    dropped = jnp.zeros((), jnp.int32)
    if "memory" in collections:
        collections, policy_state, dropped = grow(collections, grads.intermediates, grads.g, batch_size,
                                                  policy_state=policy_state, row_grads=grads.row_grads,
                                                  targets=grads.targets, replayed=grads.replayed)
    new_state = state.replace(step=state.step + 1, params=params, collections=collections, opt_state=opt_state,
                              policy_state=policy_state)
    return new_state, {"loss": grads.loss, "dropped_rows": dropped}


def train_step(model, loss_fn, tx, state: TrainState, x, y):
    """One step (pure; jit it with ``model``, ``loss_fn`` and ``tx`` static):
    :func:`step_gradients` then :func:`apply_step`.

    :class:`Trainer` runs the two halves as two jitted programs, the second one donating the
    state: in one program XLA copies every row table before the in-place append (its reads
    by retrieval come first), which cost 1.4× per step at 19k rows, d = 784.
    """
    return apply_step(tx, state, step_gradients(model, loss_fn, state, x, y), x.shape[0])


def _per_layer(what: str, value, paths, default=None) -> Dict[tuple, Any]:
    """``{path: value}`` from a single value, a ``{"layer/path": value}`` dict or a callable."""
    if isinstance(value, dict):
        names = {layer_key(p) for p in paths}
        unknown = set(value) - names
        if unknown:
            raise ConfigError(f"{what} names layers {sorted(unknown)} that the model does not have; "
                              f"its growing layers are {sorted(names)}")
        return {p: value.get(layer_key(p), default) for p in paths}
    if callable(value):
        return {p: value(layer_key(p)) for p in paths}
    return {p: value for p in paths}


@dataclasses.dataclass(frozen=True)
class SelfReplay:
    """Rehearsal from the network's own memory: every step adds ``samples`` rows of ``layer`` (default:
    the first growing layer, ``block_0`` or ``readout``; or ``"replay"``, the rehearsal layer of a
    ``ResidualGrowingNet(replay_memory=True)``, whose rows no output reads) to the batch as training samples, drawn
    uniformly with replacement among its rows of known class (``seed``, the step: the same draws on a
    resume). A row's key is its sample's input — the first layer of a :class:`~growmem.layers.ResidualGrowingNet`
    is queried with ``RMSNorm(x)``, which RMSNorm maps to itself — and its class is what the layer's
    :func:`growmem.policies.labels` (or ``capacity(on_full="evict_balanced")`` / ``"merge"``) policy keeps: replay costs
    no bytes beyond the rows and their one-byte labels. Replayed samples grow the memories like any
    others; until the layer holds a labelled row nothing is replayed."""

    samples: int
    layer: Optional[str] = None
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ConfigError(f"SelfReplay samples must be an integer >= 1, got {self.samples!r}")


@functools.partial(jax.jit, static_argnums=(4,))
def _draw_rows(k, size, labels, key, n: int):
    """``n`` rows among those in use with a label >= 0: ``(keys float32 (n, d), labels int32 (n,), count)``."""
    ok = (jnp.arange(labels.shape[0]) < size) & (labels >= 0)
    count = ok.sum(dtype=jnp.int32)
    idx = jax.random.choice(key, labels.shape[0], (n,), p=ok / jnp.maximum(count, 1))
    rows = lax.bitcast_convert_type(lax.bitcast_convert_type(k, jnp.uint16)[idx], jnp.bfloat16) \
        if k.dtype == jnp.bfloat16 else k[idx]
    return rows.astype(jnp.float32), labels[idx].astype(jnp.int32), count


class Trainer:
    """Host-side driver: initialises a model, makes room in every memory, runs jitted steps.

    >>> trainer = Trainer(model, loss="squared_error", sample_input=x0, rng=jax.random.key(0),
    ...                   policy=policies.chain(policies.novelty(0.5), policies.capacity(10_000)))
    >>> metrics = trainer.step(x, y)
    >>> y_hat = trainer.predict(x_test)

    ``policy``: a :class:`growmem.policies.Policy` for every growing layer, a
    ``{"layer/path": policy}`` dict, or a function of the layer path (None: append every
    candidate). ``backend``: where the rows live (:mod:`growmem.backends`: ``RAM()`` by default,
    ``Sharded(mesh)``, ``Tiered(directory, ram_budget_bytes=...)``, or
    ``Sharded(mesh, inner=Tiered(...))``), one for all layers or a dict per layer.
    A growing layer may see several queries per input (a ViT's FFN sees every token): each
    memory makes room for ``B ×`` its rows per input a step (:func:`rows_per_input`, read from
    the sown query shapes of ``sample_input``, else of the first batch).
    ``donate``: each step consumes the previous ``trainer.state`` so rows are appended in
    place instead of copying every memory; keep a copy (``jax.tree.map(jnp.copy,
    trainer.state)``) to step again from an old state, or pass ``donate=False``.
    """

    def __init__(self, model, *, loss="cross_entropy", tx: Optional[optax.GradientTransformation] = None,
                 sample_input=None, rng=None, variables=None, growth: float = 2.0, policy=None, backend=None,
                 donate: bool = True, replay: Optional[SelfReplay] = None):
        self.model = model
        self.loss_fn = get_loss(loss)
        self.replay = replay
        self._replay_path = None
        self.tx = tx
        if growth <= 1.0:
            raise ConfigError(f"growth factor must be > 1, got {growth}")
        self.growth = growth
        if variables is None:
            if sample_input is None:
                raise ConfigError("Trainer needs sample_input (a batch of inputs) to initialise the model")
            rng = jax.random.key(0) if rng is None else rng
            variables = jax.jit(model.init)(rng, sample_input)   # one program, not one per op
        variables = flax.core.unfreeze(variables)
        #: width of the model's output (the classes of a cross-entropy loss)
        self.d_out = None
        #: rows each growing layer adds per input (1 for an MLP; a transformer's tokens per image)
        self._per_input = None
        #: the shape of one input (``sample_input``'s without the batch axis): a batch of another is refused
        self.input_shape = None if sample_input is None else tuple(np.shape(sample_input)[1:])
        if sample_input is not None:
            out, self._per_input = _probe(model, variables, sample_input)
            self.d_out = int(out.shape[-1]) if getattr(out, "ndim", 0) >= 1 else None
        params = variables.pop("params", {})
        variables.pop("intermediates", None)
        variables.pop("perturbations", None)
        opt_state = tx.init(params) if tx is not None else None
        mems = memories(variables)
        pols = _per_layer("policy", policy, list(mems))
        bes = _per_layer("backend", backend, list(mems), backends.DEFAULT)
        installed = {}
        for p, m in mems.items():
            pol, be = pols[p], bes[p] or backends.DEFAULT
            if pol is not None and not isinstance(pol, polib.Policy):
                raise WrongTypeError(f"policy for layer {layer_key(p)} must be a growmem.policies.Policy "
                                     f"(e.g. policies.chain(...)), got {type(pol).__name__}")
            polib.coefficient_fn(m.spec, pol)   # momentum set twice is an error now, not at the first step
            be.register(m.replace(policy=pol), layer_key(p))
        for p, m in mems.items():
            installed[p] = (bes[p] or backends.DEFAULT).attach(m.replace(policy=pols[p]), layer_key(p))
        variables = set_memories(variables, installed) if installed else variables
        mems = memories(variables)
        policy_state = {layer_key(p): m.policy.init(m) for p, m in mems.items() if m.policy is not None}
        self.backends = {p: backends.of(m) for p, m in mems.items()}
        self.state = TrainState(step=jnp.zeros((), jnp.int32), params=params, collections=variables,
                                opt_state=opt_state, policy_state=policy_state or None)
        self.state = self._place(self.state)
        self._bound = {p: backends.of(m).fill(m) for p, m in mems.items()}
        #: a capacity policy's max_rows: no step leaves more rows (its evictions make the room)
        self._limit = {p: m.policy.max_rows for p, m in mems.items()
                       if m.policy is not None and m.policy.max_rows is not None}
        # two programs: gradients (reads the state), then the update (consumes it, so rows are appended
        # in place); in one program XLA would copy every row table before the append (train_step)
        self._grads = jax.jit(functools.partial(step_gradients, model, self.loss_fn))
        self._apply = jax.jit(functools.partial(apply_step, tx), static_argnums=2,
                              donate_argnums=0 if donate else ())
        self._predict = jax.jit(lambda v, x: model.apply(v, x))

    # ------------------------------------------------------------------ state
    @property
    def variables(self):
        return {"params": self.state.params, **self.state.collections}

    def memories(self) -> Dict[tuple, memlib.Memory]:
        return memories(self.state.collections)

    def _place(self, state: TrainState) -> TrainState:
        """Every non-memory leaf where the backends compute (replicated over a mesh), each layer's
        per-row policy state where its rows are."""
        be = next((b for b in self.backends.values() if b.n_shards > 1), None) if self.backends else None
        if be is None:
            return state
        pstate = state.policy_state
        if pstate:
            mems = {layer_key(p): m for p, m in memories(state.collections).items()}
            pstate = {k: polib.map_row_state(backends.of(mems[k]).place_rows, st, mems[k].capacity)
                      for k, st in pstate.items()}
        placed = jax.tree.map(lambda x: x if memlib.is_memory(x) else be.place(x),
                              state.replace(policy_state=None), is_leaf=memlib.is_memory)
        if pstate:
            pstate = jax.tree.map(lambda x: x if getattr(x, "sharding", None) == be.rows_sharding() else be.place(x),
                                  pstate)
        return placed.replace(policy_state=pstate)

    def set_state(self, state: TrainState):
        """Install ``state`` (e.g. a restored checkpoint) and reset the host-side row bounds."""
        state = self._place(state)
        self.state = state
        self._bound = {p: backends.of(m).fill(m) for p, m in memories(state.collections).items()}

    def rows_in_use(self) -> Dict[str, int]:
        """Rows of every layer, ``{"layer/path": n}``: wherever they live (RAM, shards, disk)."""
        return {layer_key(p): backends.of(m).rows_in_use(m) for p, m in self.memories().items()}

    def hot_rows(self) -> Dict[str, int]:
        """Rows of every layer held in device memory (all of them unless a tier spills to disk)."""
        return {layer_key(p): backends.of(m).hot_rows(m) for p, m in self.memories().items()}

    def cold_rows(self) -> Dict[str, int]:
        """Rows of every layer kept off the device (on a disk tier; 0 in RAM)."""
        return {layer_key(p): backends.of(m).cold_rows(m) for p, m in self.memories().items()}

    def host_rows(self) -> Dict[str, Dict[str, Any]]:
        """``{"layer/path": {"w", "k", "v", "born"}}``: every row as numpy, wherever it lives (cold
        rows first, shard by shard) — for memories that fit in RAM (tests, export)."""
        return {layer_key(p): backends.of(m).host_rows(m) for p, m in self.memories().items()}

    def compact(self) -> Dict[str, int]:
        """Run each layer policy's ``evict`` over the rows its backend keeps off the device (a
        disk tier's cold rows: pruning); returns ``{"layer/path": rows removed}``."""
        before = self.cold_rows()
        pstate = self.state.policy_state or {}
        mems = {p: backends.of(m).compact(m, polib.evictor(m.policy, pstate.get(layer_key(p))))
                for p, m in self.memories().items()}
        self.state = self.state.replace(collections=set_memories(self.state.collections, mems))
        after = self.cold_rows()
        return {k: before[k] - after[k] for k in before}

    def ensure_capacity(self, batch: int):
        """Let every memory's backend make room for the rows a batch of ``batch`` inputs adds
        (``batch`` times the layer's rows per input: 1 for an MLP, the tokens of a transformer);
        syncs only when needed: growing the capacity, spilling to disk."""
        changed, old_caps = {}, {}
        for path, mem in self.memories().items():
            new, self._bound[path] = backends.make_room(mem, batch * self._rows_per(path), self._bound[path],
                                                        self.growth, limit=self._limit.get(path))
            if new is not mem:
                changed[path], old_caps[path] = new, mem.capacity
        if changed:
            self._install(changed, old_caps)
        if any(be.due_compaction() for be in set(self.backends.values())):
            self.compact()

    def set_capacity(self, rows: int):
        """Host op: every memory's arrays hold exactly ``rows`` rows (no quantum rounding), e.g. what a
        byte budget allows; its per-row policy state follows. Rows in use are never cut, and a later
        step grows the capacity again only past a capacity policy's ``max_rows`` plus a batch."""
        rows = int(rows)
        changed, old_caps = {}, {}
        for path, mem in self.memories().items():
            if backends.of(mem) is not backends.DEFAULT:
                raise ConfigError(f"set_capacity sizes memories held in RAM; layer {layer_key(path)} lives on "
                                  f"{type(backends.of(mem)).__name__}: size it through its backend instead")
            if int(mem.size) > rows:
                raise ConfigError(f"layer {layer_key(path)} holds {int(mem.size)} rows, more than the capacity "
                                  f"{rows} asked for: evict rows first or ask for at least {int(mem.size)}")
            new = memlib.with_capacity(mem, rows, quantum=1)
            if new is not mem:
                changed[path], old_caps[path] = new, mem.capacity
        if changed:
            self._install(changed, old_caps)
            self._bound.update({p: backends.of(m).fill(m) for p, m in changed.items()})

    def _install(self, changed, old_caps):
        """Put host-changed memories into the state; per-row policy state follows a new capacity."""
        pstate = self.state.policy_state
        if pstate:
            pstate = dict(pstate)
            for path, m in changed.items():
                key = layer_key(path)
                if key in pstate and old_caps[path] != m.capacity:
                    be = backends.of(m)
                    pstate[key] = polib.map_row_state(lambda a: be.resize_rows(a, old_caps[path], m.capacity),
                                                      pstate[key], old_caps[path])
        self.state = self.state.replace(collections=set_memories(self.state.collections, changed),
                                        policy_state=pstate)

    # ------------------------------------------------------------------ steps
    def check_batch(self, x, y):
        """Clear errors for a batch the model cannot learn from: labels outside the classes of a
        cross-entropy loss, a batch of another size than its labels."""
        if len(x) != len(y):
            raise ConfigError(f"the batch has {len(x)} inputs but {len(y)} targets")
        if len(x) == 0:
            raise ConfigError("the batch is empty (0 samples): a step needs at least one sample; skip empty batches")
        if self.input_shape is not None and tuple(np.shape(x)[1:]) != self.input_shape:
            raise ConfigError(f"the batch's inputs have shape {tuple(np.shape(x)[1:])} per sample but the model was "
                              f"built for {self.input_shape} (its sample_input); reshape the inputs or build another "
                              f"Trainer")
        if self.loss_fn is squared_error and self.d_out is not None and \
                tuple(np.shape(y)[1:]) not in ((self.d_out,),) + (((),) if self.d_out == 1 else ()):
            raise ConfigError(f"the targets have shape {tuple(np.shape(y)[1:])} per sample but the model outputs "
                              f"{self.d_out} values; give targets of shape (batch, {self.d_out})")
        if self.loss_fn in CLASS_LOSSES and self.d_out is not None:
            labels = np.asarray(y)
            if not np.issubdtype(labels.dtype, np.integer):
                raise ConfigError(f"cross-entropy needs integer class labels, got {labels.dtype}")
            if labels.size and (labels.min() < 0 or labels.max() >= self.d_out):
                bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
                raise ConfigError(f"label {bad} is outside the model's {self.d_out} classes [0, {self.d_out}); fix the "
                                  f"labels, or build the model with d_out >= {int(labels.max()) + 1}")

    def step(self, x, y) -> Dict[str, float]:
        """One training step on the batch ``(x, y)``; returns ``{"loss": ..., "dropped_rows": ...}``
        (device scalars: reading them syncs). Rows that are not finite never enter a memory."""
        self.check_batch(x, y)
        x = jnp.asarray(x)
        n = x.shape[0]
        if self.replay is not None:
            x, y = self._with_replay(x, y)
        b = x.shape[0]
        if self._per_input is None:
            self._per_input = rows_per_input(self.model, self.variables, x)
        self.ensure_capacity(b)
        grads = self._grads(self.state, self._input(x), self._input(jnp.asarray(y)))
        if self.replay is not None:      # the policies see which candidates rehearse stored rows
            grads = grads._replace(replayed=self._input(jnp.arange(b) >= n))
        self.state, metrics = self._apply(self.state, grads, b)
        for path in self._bound:
            self._bound[path] = _capped(self._bound[path] + b * self._rows_per(path), self._limit.get(path))
        return metrics

    def _replay_layer(self) -> tuple:
        """The path of the layer :class:`SelfReplay` draws from (checked once: the network's rehearsal layer
        ``replay`` or its first growing layer, whose keys are the normalised inputs, keeping its rows' labels)."""
        if self._replay_path is not None:
            return self._replay_path
        mems = self.memories()
        first = sorted(mems, key=lambda p: (p != ("block_0",), p != ("readout",), p))[0]
        want = tuple(self.replay.layer.split("/")) if self.replay.layer else first
        if want not in (first, ("replay",)) or want not in mems:
            raise ConfigError(f"SelfReplay replays keys that are the network's inputs: those of its first growing "
                              f"layer ({layer_key(first)}) or of its rehearsal layer 'replay' (replay_memory=True); "
                              f"got layer {self.replay.layer!r}")
        mem = mems[want]
        if mem.policy is None or polib.stored_labels(jax.eval_shape(mem.policy.init, mem)) is None:
            raise ConfigError(f"SelfReplay needs the labels of {layer_key(want)}'s rows: give that layer a "
                              f"policies.labels() (or capacity(on_full='evict_balanced' or 'merge')) policy")
        self._replay_path = want
        return want

    def _with_replay(self, x, y):
        """``(x, y)`` with :class:`SelfReplay`'s samples appended (unchanged while no row is labelled)."""
        path = self._replay_layer()
        state = (self.state.policy_state or {}).get(layer_key(path))
        labels = polib.stored_labels(state)
        if labels is None:          # before the first step: nothing stored yet
            return x, y
        mem = self.memories()[path]
        key = jax.random.fold_in(jax.random.key(self.replay.seed), int(self.state.step))
        xr, yr, count = _draw_rows(mem.k, mem.size, labels, key, self.replay.samples)
        if int(count) == 0:
            return x, y
        return jnp.concatenate([x, xr.astype(x.dtype).reshape((-1,) + x.shape[1:])]), \
            jnp.concatenate([jnp.asarray(y), yr.astype(jnp.asarray(y).dtype)])

    def _rows_per(self, path) -> int:
        return 1 if self._per_input is None else self._per_input.get(path, 1)

    def _input(self, x):
        be = next((b for b in self.backends.values() if b.n_shards > 1), None)
        return x if be is None else be.place(x)

    def predict(self, x, batch_size: int = 1024):
        outs = [self._predict(self.variables, self._input(jnp.asarray(x[i:i + batch_size])))
                for i in range(0, len(x), batch_size)]
        return jnp.concatenate(outs, axis=0)


# ---------------------------------------------------------------------------------------------
# the training loop


def _capped(n: int, limit: Optional[int]) -> int:
    return n if limit is None else min(n, int(limit))


def epoch_order(rng, epoch: int, n: int) -> np.ndarray:
    """The permutation of ``n`` examples used in ``epoch`` (a pure function of ``rng``)."""
    return np.asarray(jax.random.permutation(jax.random.fold_in(rng, epoch), n))


class Batches:
    """Mini-batches of arrays ``(x, y)`` in an epoch-wise shuffled order that is a pure function
    of ``(rng, epoch)``, addressed by step: ``batches(step)`` is the batch of 1-based ``step``,
    so a resumed run replays exactly the batches the interrupted one would have seen."""

    def __init__(self, x, y, batch_size: int, *, rng=None, shuffle: bool = True, drop_last: bool = True):
        self.x, self.y = x, y
        self.n = len(x)
        if len(y) != self.n:
            raise ConfigError(f"the dataset has {self.n} inputs but {len(y)} targets")
        if self.n == 0:
            raise ConfigError("the dataset is empty (0 samples): there is nothing to train on; check the data given")
        if batch_size <= 0 or batch_size > self.n:
            raise ConfigError(f"batch_size must be in [1, {self.n}], got {batch_size}")
        self.batch_size = batch_size
        self.rng = jax.random.key(0) if rng is None else rng
        self.shuffle = shuffle
        self.per_epoch = self.n // batch_size if drop_last else -(-self.n // batch_size)
        self._order = {}

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        if epoch not in self._order:
            self._order = {epoch: epoch_order(self.rng, epoch, self.n)}
        return self._order[epoch]

    def position(self, step: int) -> dict:
        """``{"epoch", "batch"}`` reached after 1-based ``step``."""
        epoch, batch = divmod(step, self.per_epoch)
        return {"epoch": epoch, "batch": batch}

    def __call__(self, step: int):
        epoch, b = divmod(step - 1, self.per_epoch)
        idx = self.order(epoch)[b * self.batch_size:(b + 1) * self.batch_size]
        return self.x[idx], self.y[idx]


class NonFiniteLossError(NumericalError):
    """The training loss became NaN or infinite; the message names the step and the last finite loss."""


def fit(trainer: Trainer, batches: Callable[[int], tuple], *, steps: int, start: int = 0,
        checkpoint: Optional[Callable[[int], Any]] = None, every: int = 0,
        on_step: Optional[Callable[[int, dict], None]] = None, evaluate: Optional[Callable[[int], dict]] = None,
        eval_every: int = 0, progress: bool = False, desc: str = "train", stop: Optional[Callable[[], bool]] = None,
        on_nonfinite: str = "stop", before_step: Optional[Callable[[int, tuple], None]] = None) -> dict:
    """The training loop used by the CLI, the benchmarks, the experiments and the continual runs.

    Runs steps ``start+1 .. steps``: ``batches(step) -> (x, y)`` (or any tuple: the step is
    ``trainer.step(*batch)``, e.g. a continual learner's ``(x, y, t)``); ``before_step(step, batch)``
    before each (e.g. a prequential prediction); ``on_step(step, metrics)`` after each
    (``metrics["loss"]``, where there is one, is a device scalar: reading it syncs); every ``eval_every``
    steps (and at the end) ``evaluate(step) -> dict`` (a NaN/inf metric stops the run: it cannot
    recover); every ``every`` steps (and at the end) ``checkpoint(step)`` (e.g.
    ``lambda step: ckpt.save(trainer, step, data_position={"step": step})``). ``stop()`` is
    polled after every step (e.g. a Ctrl-C flag): the loop ends there, after a checkpoint.

    ``on_nonfinite``: a step whose loss is NaN or infinite (a bad sample: its rows are dropped,
    the other samples' rows enter) — ``"stop"`` raises :class:`NonFiniteLossError` at the next
    checkpoint, evaluation or the end, *before* anything is saved, naming the step and the last
    finite loss; ``"skip"`` trains on and counts such steps. The check costs no sync per step.
    Returns ``{"step", "evals", "seconds", "steps_per_second", "stopped", "nonfinite_steps"}``.
    """
    if on_nonfinite not in ("stop", "skip"):
        raise ConfigError(f"on_nonfinite must be 'stop' or 'skip', got {on_nonfinite!r}")
    evals, pending, nonfinite, last_finite = [], [], [0], [None]   # pending: (step, device loss) unchecked

    def check():
        """Read the losses since the last check (one sync); stop at a non-finite one."""
        losses = np.asarray(jax.device_get([l for _, l in pending]), np.float64).reshape(-1) if pending else []
        steps_seen = [s for s, _ in pending]
        pending.clear()
        for s, l in zip(steps_seen, losses):
            if math.isfinite(l):
                last_finite[0] = (s, float(l))
                continue
            nonfinite[0] += 1
            if on_nonfinite == "stop":
                lf = "none yet" if last_finite[0] is None else f"{last_finite[0][1]:.6g} at step {last_finite[0][0]}"
                raise NonFiniteLossError(
                    f"the training loss became {l} at step {s} (last finite loss: {lf}); nothing was saved "
                    f"after it — check the data and the hyper-parameters (a NaN input, a too large learning rate, "
                    f"η or β)")

    from growmem.reporting import progress_bar
    bar = progress_bar(steps, desc, initial=start, enabled=progress)
    t0 = time.perf_counter()
    step, stopped = start, None
    try:
        for step in range(start + 1, steps + 1):
            batch = batches(step)
            if before_step is not None:
                before_step(step, batch)
            metrics = trainer.step(*batch)
            if metrics.get("loss") is not None:
                pending.append((step, metrics["loss"]))
            if on_step is not None:
                on_step(step, metrics)
            last = step == steps
            due_eval = evaluate is not None and eval_every and (step % eval_every == 0 or last)
            due_ckpt = checkpoint is not None and every and (step % every == 0 or last)
            if due_eval or due_ckpt or last or len(pending) >= 1024:
                check()
            if due_eval:
                ev = dict(evaluate(step), step=step)
                evals.append(ev)
                if bar is not None:
                    bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in ev.items()
                                     if k != "step"})
                bad = [k for k, v in ev.items() if isinstance(v, float) and not math.isfinite(v)]
                if bad:
                    stopped = f"non-finite {', '.join(bad)} at step {step}"
            if stopped:   # a diverged state is never checkpointed
                break
            if due_ckpt:
                checkpoint(step)
            if bar is not None:
                bar.update(1)
            if stop is not None and stop():
                stopped = f"stopped at step {step}"
                if checkpoint is not None and every and not due_ckpt:
                    check()
                    checkpoint(step)
                break
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    done = step - start
    return {"step": step, "evals": evals, "seconds": seconds,
            "steps_per_second": done / seconds if seconds > 0 and done > 0 else None, "stopped": stopped,
            "nonfinite_steps": nonfinite[0]}
