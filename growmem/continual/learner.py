"""The growmem side of a continual run, free of PyTorch and Avalanche.

:class:`GrowmemConfig` names the growmem recipe (a preset from ``policies/`` plus overrides) so
it can be swapped without touching the runner; :class:`GrowmemLearner` holds one learner
(:class:`growmem.learner.Learner`: a target memory, an order-free model, or a growing network's
``Trainer`` behind :class:`NetworkLearner`) per task label and does what both the Avalanche strategy
(:class:`growmem.continual.strategy.GrowmemStrategy`) and the fast native loop
(:mod:`growmem.continual.fast`) need: check inputs, step on a numpy mini-batch, predict,
count bytes, save and restore through the core ``Checkpointer``.

**Task labels** (task-incremental streams): each task label gets its own growmem model — a
readout per task (with ``n_blocks > 0`` its residual blocks are per task too). A sample is
answered by the model of its task label; a task never trained answers zeros (class 0).
Class- and domain-incremental streams carry one task label, hence one model.

**Memory budget**: ``budget_bytes`` caps every model with a ``capacity(max_rows, on_full)``
policy appended to each layer's chain, ``max_rows`` chosen so that the rows plus the model's
other state fit the budget (split evenly over ``n_tasks``) both in use and as allocated: every
memory allocates exactly the ``max_rows + batch`` rows the budget holds (``Trainer.set_capacity``,
no 256-row quanta), and the trainer never allocates beyond them. A budget below the model's
initial rows (D0) is refused.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

from growmem.units import byte_budget

from .errors import ConfigError, InputShapeError, UnknownNameError
from .methods import KEY_SETS

#: the default network (policies/continual_growmem.toml): the weighted_softmax preset's readout,
#: no residual blocks, every row kept
DEFAULT_PRESET = "continual_growmem"


#: the order-free models (``growmem.order_free``) by method family; their key sets are
#: :data:`growmem.continual.methods.KEY_SETS` (the keys a target preset uses, or the pixels themselves)
ORDER_FREE_MODELS = {"knn": "KNN", "ncm": "NCM", "slda": "SLDA"}
#: batch size of the order-free models (they see each sample once; the batch only paces the loop)
ORDER_FREE_BATCH = 256
#: raw-pixel kNN stores the pixels as a user would, one byte each: the stream's inputs are the MNIST family's
#: 8-bit images after Avalanche's Normalize((0.1307,), (0.3081,)) (an input off that grid is an error)
ORDER_FREE_DEFAULTS = {("knn", "raw"): {"row_dtype": "uint8", "normalize": (0.1307, 0.3081)}}


@dataclasses.dataclass(frozen=True)
class OrderFreePreset:
    """An order-free baseline (``knn:dct``, ``ncm:raw``, ...): a model of :mod:`growmem.order_free` over a
    key set, with its hyperparameters ``params`` (e.g. ``(("k", 3),)``). Built per task like a target
    memory (:meth:`memory`)."""

    family: str
    keys: str
    params: Tuple[Tuple[str, Any], ...] = ()

    kind = "order_free"

    @property
    def name(self) -> str:
        return f"{self.family}:{self.keys}"

    @property
    def path(self) -> str:
        return self.name

    @property
    def description(self) -> str:
        return f"growmem.order_free.{ORDER_FREE_MODELS[self.family]} on {self.keys} keys {dict(self.params)}"

    @property
    def settings(self) -> dict:
        return {"batch_size": ORDER_FREE_BATCH, "epochs": 1.0, "seed": 0}

    def key_space(self, d_in: int):
        from growmem import config, keyspaces

        if KEY_SETS[self.keys] is not None:
            return config.load(KEY_SETS[self.keys]).key_space(d_in)
        return keyspaces.make("identity", d_in, normalise=False)

    def memory(self, d_in: int, d_out: int, *, budget_bytes: Optional[int] = None, seed: Optional[int] = None):
        from growmem import order_free

        cls = getattr(order_free, ORDER_FREE_MODELS[self.family])
        params = {**ORDER_FREE_DEFAULTS.get((self.family, self.keys), {}), **dict(self.params)}
        return cls(self.key_space(d_in), d_out, budget_bytes=budget_bytes, seed=0 if seed is None else int(seed),
                   **params)


@dataclasses.dataclass(frozen=True)
class GrowmemConfig:
    """A growmem recipe: a preset (name in ``policies/`` or a TOML path, or an order-free model such as
    ``knn:dct``) plus overrides.

    ``n_blocks``, ``batch_size``, ``epochs`` override the preset's; ``max_rows`` appends a
    ``capacity(max_rows, on_full)`` policy to every layer (a budget does this too); ``overrides``:
    ``(("section.key", value), ...)`` applied to the preset file before it is validated
    (:func:`growmem.config.apply_overrides`), or an order-free model's hyperparameters.
    """

    preset: str = DEFAULT_PRESET
    n_blocks: Optional[int] = None
    batch_size: Optional[int] = None
    epochs: Optional[int] = None
    max_rows: Optional[int] = None
    on_full: str = "evict_oldest"
    overrides: Tuple[Tuple[str, Any], ...] = ()

    def load(self):
        """The preset with the overrides applied (a ``growmem.config.Preset``, ``TargetPreset`` or an
        :class:`OrderFreePreset`)."""
        from growmem import config

        family, _, keys = str(self.preset).partition(":")
        if family in ORDER_FREE_MODELS:
            if keys not in KEY_SETS or any(v is not None for v in (self.n_blocks, self.max_rows)):
                raise ConfigError(f"{self.preset}: an order-free model takes keys {tuple(KEY_SETS)} and no n_blocks / "
                                  f"max_rows (bound it with a memory budget)")
            return OrderFreePreset(family, keys, tuple(sorted(self.overrides)))
        try:
            preset = config.load(self.preset, dict(self.overrides))
        except config.UnknownPresetError:
            names = [n for n, _, _ in config.available()]
            raise UnknownNameError(f"unknown growmem preset {self.preset!r}; valid presets: {', '.join(names)} "
                                   f"(or a path to a preset TOML file)") from None
        if getattr(preset, "kind", None) == "target":
            return self._load_target(preset)
        if self.n_blocks is not None:
            preset = dataclasses.replace(preset, n_blocks=int(self.n_blocks))
        preset = self._with_train_overrides(preset)
        if self.max_rows is not None:
            preset = with_row_cap(preset, int(self.max_rows), self.on_full)
        return preset

    def _with_train_overrides(self, preset):
        """``preset`` with this config's batch size and epochs, where given."""
        if self.batch_size is None and self.epochs is None:
            return preset
        train = dict(preset.train)
        if self.batch_size is not None:
            train["batch_size"] = int(self.batch_size)
        if self.epochs is not None:
            train["epochs"] = float(self.epochs)
        return dataclasses.replace(preset, train=tuple(sorted(train.items())))

    def _load_target(self, preset):
        """A target-memory preset with the overrides that apply to it."""
        if self.n_blocks is not None or self.max_rows is not None:
            raise ConfigError(f"preset {preset.name!r} is a target memory (no residual blocks, no row cap): drop "
                              f"n_blocks / max_rows and bound it with a memory budget (--memory-budget)")
        preset = self._with_train_overrides(preset)
        return preset

    @property
    def name(self) -> str:
        from pathlib import Path
        return Path(self.preset).stem

    def describe(self) -> dict:
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        out["overrides"] = {k: v for k, v in self.overrides}
        return out


def with_row_cap(preset, max_rows: int, on_full: str = "evict_oldest"):
    """``preset`` whose every layer also holds at most ``max_rows`` rows, with an initial capacity that
    never needs to grow past the cap: the preset's own ``capacity`` policies (one per layer when its entries
    name a ``layer``) get ``max_rows`` (their ``on_full`` kept), or one is appended last in the chain with
    ``on_full``."""
    if max_rows < 1:
        raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
    entries = list(preset.policy_entries)
    own = [i for i, (name, _) in enumerate(entries) if name == "capacity"]
    for i in own:
        params = dict(entries[i][1], max_rows=int(max_rows))
        entries[i] = ("capacity", tuple(sorted(params.items())))
    covered = {dict(entries[i][1]).get("layer") for i in own}
    if not own:
        entries.append(("capacity", (("max_rows", int(max_rows)), ("on_full", on_full))))
    elif None not in covered:     # a layer whose capacity entries name only the other layer gets one of its own
        entries += [("capacity", (("layer", kind), ("max_rows", int(max_rows)), ("on_full", on_full)))
                    for kind in ("block", "readout") + (("replay",) if preset.replay_memory else ())
                    if kind not in covered]
    batch = int(preset.settings["batch_size"])
    return dataclasses.replace(preset, policy_entries=tuple(entries), capacity=max_rows + batch)


def bytes_per_row(preset, d_in: int, d_out: int) -> int:
    """Row bytes (w, k, ṽ, born at their stored dtypes) summed over the layers of the preset's model
    (``n_blocks`` blocks + readout, and the rehearsal layer of ``replay_memory``, one-wide values); per-row
    policy state (a hybrid layer's optimizer moments, labels) is measured on a model by
    :meth:`GrowmemLearner._other_bytes`."""
    from growmem.memory import row_bytes

    return preset.n_blocks * row_bytes(d_in, d_in, preset.block.row_dtype) + \
        row_bytes(d_in, d_out, preset.readout.row_dtype) + \
        (row_bytes(d_in, 1, preset.block.row_dtype) if preset.replay_memory else 0)


class GrowmemLearner:
    """One growmem ``Trainer`` per task label, fed numpy mini-batches.

    ``num_classes``: output size. ``input_size``: features per sample (inferred from the first
    batch when None). ``budget_bytes``: see the module docstring. ``seed``: model init
    (``jax.random.key(seed)``, folded with the task label).
    """

    def __init__(self, config: Optional[GrowmemConfig] = None, *, num_classes: int, input_size: Optional[int] = None,
                 budget_bytes: Optional[int] = None, n_tasks: int = 1, seed: int = 0):
        if isinstance(config, str):
            config = GrowmemConfig(preset=config)
        self.config = config or GrowmemConfig()
        self.preset = self.config.load()
        if int(num_classes) < 2:
            raise ConfigError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = int(num_classes)
        self.input_size = None if input_size is None else int(input_size)
        self.input_shape = None
        #: how the per-task models are made: memories that are learners themselves (a target memory or an
        #: order-free model), or a growing network's Trainer behind a NetworkLearner (build, budget, byte fields,
        #: description, restore by template or by path: every difference between the two lives there)
        self.models = _Memories() if getattr(self.preset, "kind", None) in ("target", "order_free") else _Networks()
        if budget_bytes is None:
            budget_bytes = self.models.own_budget(self.preset)   # a memory preset's own budget, if it has one
        self.budget_bytes = byte_budget(budget_bytes)   # the one rule (growmem.units): None, bytes or "15.7MB"
        self.n_tasks = max(1, int(n_tasks))
        self.seed = int(seed)
        #: the model of each task label, a learner (:class:`growmem.learner.Learner`): ``observe``, ``predict``,
        #: ``state``, ``nbytes``, ``rows``
        self.trainers: Dict[str, Any] = {}
        self.max_rows: Optional[int] = None
        #: rows every memory allocates under the budget (exactly; ``max_rows`` plus a batch)
        self.rows_allocated: Optional[int] = None
        self._space = None   # a network preset's [inputs] key space (built with the first model)

    # ------------------------------------------------------------------ settings
    @property
    def batch_size(self) -> int:
        return int(self.preset.settings["batch_size"])

    @property
    def epochs(self) -> int:
        return max(1, int(math.ceil(float(self.preset.settings["epochs"]))))

    def describe(self) -> dict:
        return self.models.describe(self)

    # ------------------------------------------------------------------ inputs
    def as_inputs(self, x) -> np.ndarray:
        """``x`` (any array of shape ``(B, *shape)``) as float32 ``(B, input_size)``, checked."""
        x = np.asarray(x)
        if x.ndim < 1 or len(x) == 0:
            raise InputShapeError(f"expected a non-empty batch of inputs (B, ...), got shape {x.shape}")
        shape = tuple(x.shape[1:])
        n = int(np.prod(shape)) if shape else 1
        if self.input_size is None:
            self.input_size = n
        if n != self.input_size:
            want = self.input_shape if self.input_shape is not None else (self.input_size,)
            raise InputShapeError(
                f"the stream's inputs have shape {shape} ({n} features per sample) but the growmem model takes "
                f"inputs of shape {tuple(want)} ({self.input_size} features): use a stream whose inputs fit, or a "
                f"new strategy (input_size={n})")
        if self.input_shape is None:
            self.input_shape = shape
        return np.ascontiguousarray(x.reshape(len(x), n), dtype=np.float32)

    def check_labels(self, y) -> np.ndarray:
        y = np.asarray(y).astype(np.int32).reshape(-1)
        if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            bad = int(y.max()) if y.max() >= self.num_classes else int(y.min())
            raise InputShapeError(f"label {bad} is outside the model's {self.num_classes} classes (num_classes="
                                  f"{self.num_classes}); pass num_classes >= {int(y.max()) + 1}")
        return y

    # ------------------------------------------------------------------ models
    @staticmethod
    def task_key(task) -> str:
        return f"task{int(task)}"

    def _cap_preset(self, d_in: int):
        """The preset with the row cap the budget allows (or the preset itself).

        The rows the budget holds, ``R = (budget - other state) // bytes per row``, are what the model's
        memories allocate, exactly (:meth:`growmem.train.Trainer.set_capacity` in ``_Networks.build``);
        ``max_rows = R - batch`` rows are kept so that a step's candidates fit in them too (``R`` when the
        budget holds no more than one batch). The input key space's state comes off the budget first."""
        if self.budget_bytes is None:
            return self.preset
        # the input key space's state (a DCT factor) is counted once, beside the tasks' models (memory_bytes)
        space = 0 if self._space is None else int(self._space.nbytes())
        per_task = (self.budget_bytes - space) // self.n_tasks
        # the model's other state (parameters, optimizer, policy states) does not depend on max_rows: measure
        # it once on a model with the cap, with the per-row policy state (e.g. labels) a row adds
        other, state_per_row = self._other_bytes(with_row_cap(self.preset, 1, self.config.on_full), d_in)
        per_row = bytes_per_row(self.preset, d_in, self.num_classes) + state_per_row
        r = (per_task - other) // per_row
        if r < 1:
            raise ConfigError(f"memory budget {self.budget_bytes} B ({per_task} B per task) does not hold the "
                              f"model's fixed state ({other} B) plus one row ({per_row} B, d_in={d_in}, "
                              f"d_out={self.num_classes}); raise the budget")
        self.rows_allocated, self._sizes = int(r), (int(other), int(per_row))
        self.max_rows = int(r - self.batch_size if r - self.batch_size >= 1 else r)
        return with_row_cap(self.preset, self.max_rows, self.config.on_full)

    def _other_bytes(self, preset, d_in: int):
        """``(bytes besides the rows, bytes of per-row policy state per row summed over the layers)`` of a
        model of ``preset``."""
        from growmem import policies
        from .memory_bytes import growmem_bytes
        import jax

        t = preset.trainer(np.zeros((1, d_in), np.float32), self.num_classes, rng=jax.random.key(0))
        b = growmem_bytes({"probe": t})
        per_row = 0
        for mem in t.memories().values():
            if mem.policy is not None:
                leaves = policies.row_state_leaves(jax.eval_shape(mem.policy.init, mem), mem.capacity)
                per_row += sum(int(np.prod(a.shape[1:], dtype=np.int64)) * np.dtype(a.dtype).itemsize
                               for a in leaves)
        return b["bytes_in_use"] - b["rows_in_use_bytes"] - b["hybrid_in_use_bytes"], per_row

    def trainer_for(self, task: int, d_in: Optional[int] = None):
        """The model of ``task`` (built on first use)."""
        key = self.task_key(task)
        if key not in self.trainers:
            self.trainers[key] = self.models.build(self, int(task), int(d_in or self.input_size))
        return self.trainers[key]

    def _features(self, x: np.ndarray):
        """What a network preset's Trainer reads for inputs ``x``: its ``[inputs]`` key space's features
        (:meth:`growmem.config.Preset.features`), or ``x`` itself."""
        if self._space is None and getattr(self.preset, "inputs", None):
            self._space = self.preset.input_space(x.shape[1])
        return x if self._space is None else np.asarray(self.preset.features(self._space, x))

    # ------------------------------------------------------------------ train / predict
    def step(self, x, y, t=None) -> dict:
        """One ``observe`` of each task label's model on its samples of the batch (in batch order)."""
        x = self.as_inputs(x)
        y = self.check_labels(y)
        tasks = np.zeros(len(x), np.int64) if t is None else np.asarray(t).reshape(-1)
        out = {}
        for task in np.unique(tasks):
            idx = np.flatnonzero(tasks == task)
            model = self.trainer_for(int(task), x.shape[1])
            sel = slice(None) if len(idx) == len(x) else idx
            out[self.task_key(task)] = model.observe(x[sel], y[sel])
        return out

    def predict(self, x, t=None, batch_size: int = 1024) -> np.ndarray:
        """Logits ``(B, num_classes)`` float32; samples of an untrained task get zeros."""
        x = self.as_inputs(x)
        tasks = np.zeros(len(x), np.int64) if t is None else np.asarray(t).reshape(-1)
        out = np.zeros((len(x), self.num_classes), np.float32)
        for task in np.unique(tasks):
            key = self.task_key(task)
            if key not in self.trainers:
                continue
            idx = np.flatnonzero(tasks == task)
            sel = slice(None) if len(idx) == len(x) else idx
            out[sel] = np.asarray(self.trainers[key].predict(x[sel], batch_size=batch_size), np.float32)
        return out

    def rows_in_use(self) -> Dict[str, int]:
        return {f"{k}/{part}": n for k, m in self.trainers.items() for part, n in m.rows().items()}

    def memory_bytes(self) -> dict:
        """Bytes of every task's model (their ``nbytes()`` summed, in the fields of this kind's count) and of
        a network preset's input key space (shared by the tasks, counted once)."""
        out = dict(self.models.empty_bytes())
        for m in self.trainers.values():
            for k, v in m.nbytes().items():
                out[k] = out.get(k, 0) + int(v)
        if self._space is not None:       # the fixed input key space's state (e.g. the DCT factor)
            extra = int(self._space.nbytes())
            out.update(other_bytes=out["other_bytes"] + extra, bytes_in_use=out["bytes_in_use"] + extra,
                       bytes_allocated=out["bytes_allocated"] + extra)
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self, checkpointer, step: int, *, data_position=None, extra=None, config=None) -> int:
        """Save every task model's ``state()`` with the core ``Checkpointer`` (one checkpoint)."""
        state = {k: m.state() for k, m in self.trainers.items()}
        extra = {**(extra or {}), "learner": {"tasks": sorted(self.trainers), "input_size": self.input_size,
                                              "input_shape": list(self.input_shape or ()),
                                              "max_rows": self.max_rows}}
        return checkpointer.save(state if state else None, step, data_position=data_position, extra=extra,
                                 config=config)

    def restore(self, checkpointer, step: Optional[int] = None, *, config=None):
        """Restore the models saved by :meth:`save` (builds them first); returns ``Restored``. Models whose
        state keeps its shapes (``fixed_shapes``: a network's preallocated rows) are restored into a template of
        them; the others (rows of any count) from the saved arrays by path, checked against their checksums."""
        meta = checkpointer.read_meta(step)
        info = (meta.get("extra") or {}).get("learner", {})
        if info.get("input_size") is not None:
            self.input_size = int(info["input_size"])
            self.input_shape = tuple(info.get("input_shape") or (self.input_size,))
        for key in info.get("tasks", []):
            self.trainer_for(int(key[len("task"):]), self.input_size)
        if self.models.fixed_shapes:
            template = {k: m.state() for k, m in self.trainers.items()} or None
            r = checkpointer.restore(template, step, config=config)
            for k, m in self.trainers.items():
                m.load_state(r.state[k])
            return r
        return _restore_by_path(self, checkpointer, meta, config)


def _restore_by_path(learner, checkpointer, meta, config):
    """The saved arrays read by path into each task model's ``load_state``, after the config check."""
    r = checkpointer.restore_leaves(int(meta["step"]), config=config)
    states: Dict[str, dict] = {}
    for path, a in r.state.items():
        task, _, name = path.partition("/")
        states.setdefault(task, {})[name] = a
    for key, m in learner.trainers.items():
        m.load_state(states[key])
    return r


class NetworkLearner:
    """A growing network's ``Trainer`` as a learner (:mod:`growmem.learner`): ``observe`` is one
    ``Trainer.step`` on the inputs' ``features`` (a preset's ``[inputs]`` key space, shared by the tasks' models
    and counted once by :meth:`GrowmemLearner.memory_bytes`); its state is the trainer's, of fixed shapes (the
    rows a budget allows are allocated up front)."""

    fixed_shapes = True

    def __init__(self, trainer, features):
        self.trainer, self._features = trainer, features

    def inputs(self, x) -> np.ndarray:
        """What the trainer reads for inputs ``x`` (rows of the learner's inputs): the preset's features."""
        return self._features(x)

    def observe(self, x, y) -> dict:
        return self.trainer.step(self._features(x), y)

    def predict(self, x, batch_size: int = 1024):
        return self.trainer.predict(self._features(x), batch_size=batch_size)

    def state(self):
        return self.trainer.state

    def load_state(self, state) -> None:
        self.trainer.set_state(state)

    def nbytes(self) -> Dict[str, int]:
        from .memory_bytes import growmem_bytes
        return growmem_bytes({"model": self.trainer})

    def rows(self) -> Dict[str, int]:
        return self.trainer.rows_in_use()


class _Memories:
    """How the per-task models of a target-memory or order-free preset are made: each a memory that is a
    learner itself (it reads the raw inputs: its key space is its own) and takes the budget whole."""

    fixed_shapes = False

    @staticmethod
    def own_budget(preset):
        return getattr(preset, "budget_bytes", None)

    @staticmethod
    def build(learner, task: int, d_in: int):
        per_task = None if learner.budget_bytes is None else learner.budget_bytes // learner.n_tasks
        return learner.preset.memory(d_in, learner.num_classes, budget_bytes=per_task,
                                     seed=learner.seed * 1000 + int(task))

    @staticmethod
    def empty_bytes() -> dict:
        from .memory_bytes import target_bytes
        return target_bytes({})

    @staticmethod
    def describe(learner) -> dict:
        return {"config": learner.config.describe(), "preset_path": learner.preset.path, "kind": "target",
                "batch_size": learner.batch_size, "epochs": learner.epochs, "budget_bytes": learner.budget_bytes,
                "tasks": {k: m.describe() for k, m in sorted(learner.trainers.items())}}


class _Networks:
    """How the per-task models of a growing-network preset are made: a ``Trainer`` each, behind a
    :class:`NetworkLearner`, its rows capped by the budget and allocated exactly."""

    fixed_shapes = True

    @staticmethod
    def own_budget(preset):
        return None

    @staticmethod
    def build(learner, task: int, d_in: int):
        """A growing network's Trainer for ``task``: its rows capped by the budget, allocated exactly."""
        import jax

        d_feat = learner._features(np.zeros((1, d_in), np.float32)).shape[1]
        preset = learner._cap_preset(d_feat)
        rng = jax.random.fold_in(jax.random.key(learner.seed), int(task))
        tr = preset.trainer(np.zeros((1, d_feat), np.float32), learner.num_classes, rng=rng)
        if learner.budget_bytes is not None:
            d0 = max(tr.rows_in_use().values(), default=0)
            if d0 > learner.rows_allocated:
                other, per_row = learner._sizes
                need = (other + per_row * (d0 + learner.batch_size)) * learner.n_tasks
                raise ConfigError(f"memory budget {learner.budget_bytes} B holds {learner.rows_allocated} rows per "
                                  f"layer of the {learner.preset.name!r} model, fewer than its {d0} initial rows "
                                  f"(D0, init_rows) and a batch: raise the budget to at least {need} B or lower "
                                  f"init_rows")
            tr.set_capacity(learner.rows_allocated)
        return NetworkLearner(tr, learner._features)

    @staticmethod
    def empty_bytes() -> dict:
        from .memory_bytes import growmem_bytes
        return growmem_bytes({})

    @staticmethod
    def describe(learner) -> dict:
        return {"config": learner.config.describe(), "preset_path": learner.preset.path,
                "n_blocks": learner.preset.n_blocks, "batch_size": learner.batch_size, "epochs": learner.epochs,
                "readout": repr(learner.preset.readout), "max_rows": learner.max_rows,
                "budget_bytes": learner.budget_bytes, "tasks": sorted(learner.trainers)}
