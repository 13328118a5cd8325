"""The growmem side of a continual run, free of PyTorch and Avalanche.

:class:`GrowmemConfig` names the growmem recipe (a preset from ``policies/`` plus overrides) so
it can be swapped without touching the runner; :class:`GrowmemLearner` holds one growmem
``Trainer`` per task label and does what both the Avalanche strategy
(:class:`growmem.continual.strategy.GrowmemStrategy`) and the fast native loop
(:mod:`growmem.continual.fast`) need: check inputs, step on a numpy mini-batch, predict,
count bytes, save and restore through the core ``Checkpointer``.

**Task labels** (task-incremental streams): each task label gets its own growmem model — a
readout per task (with ``n_blocks > 0`` its residual blocks are per task too). A sample is
answered by the model of its task label; a task never trained answers zeros (class 0).
Class- and domain-incremental streams carry one task label, hence one model.

**Memory budget**: ``budget_bytes`` caps every model with a ``capacity(max_rows, on_full)``
policy appended to each layer's chain, ``max_rows`` chosen so that the rows plus the model's
other state fit the budget (split evenly over ``n_tasks``) both in use and as allocated: the
initial capacity is ``max_rows + batch`` rows (whole 256-row quanta), so the trainer never
allocates beyond it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

import numpy as np

from .errors import InputShapeError, UnknownNameError

#: the placeholder growmem recipe (policies/continual_growmem.toml): the weighted_softmax
#: preset's readout, no residual blocks
DEFAULT_PRESET = "continual_growmem"


@dataclasses.dataclass(frozen=True)
class GrowmemConfig:
    """A growmem recipe: a preset (name in ``policies/`` or a TOML path) plus overrides.

    ``n_blocks``, ``batch_size``, ``epochs`` override the preset's; ``max_rows`` appends a
    ``capacity(max_rows, on_full)`` policy to every layer (a budget does this too).
    """

    preset: str = DEFAULT_PRESET
    n_blocks: Optional[int] = None
    batch_size: Optional[int] = None
    epochs: Optional[int] = None
    max_rows: Optional[int] = None
    on_full: str = "evict_oldest"

    def load(self):
        """The preset with the overrides applied (a ``growmem.config.Preset``)."""
        from growmem import config

        try:
            preset = config.load(self.preset)
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
            raise ValueError(f"preset {preset.name!r} is a target memory (no residual blocks, no row cap): drop "
                             f"n_blocks / max_rows and bound it with a memory budget (--memory-budget)")
        preset = self._with_train_overrides(preset)
        return preset

    @property
    def name(self) -> str:
        from pathlib import Path
        return Path(self.preset).stem

    def describe(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def with_row_cap(preset, max_rows: int, on_full: str = "evict_oldest"):
    """``preset`` whose every layer also holds at most ``max_rows`` rows (capacity policy last
    in the chain), with an initial capacity that never needs to grow past the cap."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    cap = ("capacity", (("max_rows", int(max_rows)), ("on_full", on_full)))
    batch = int(preset.settings["batch_size"])
    return dataclasses.replace(preset, policy_entries=tuple(preset.policy_entries) + (cap,),
                               capacity=max_rows + batch)


def bytes_per_row(preset, d_in: int, d_out: int) -> int:
    """Row bytes summed over the layers of the preset's model (``n_blocks`` blocks + readout), at
    their stored dtypes; a hybrid layer's row also carries its optimizer moments (two float32
    values per trained value w, k, ṽ: Adam)."""
    from growmem.memory import row_bytes

    def layer(spec, d_o, hybrid):
        b = row_bytes(d_in, d_o, spec.row_dtype)
        return b + (2 * 4 * (1 + d_in + d_o) if hybrid else 0)
    return (preset.n_blocks * layer(preset.block, d_in, "block" in preset.hybrid_layers)
            + layer(preset.readout, d_out, "readout" in preset.hybrid_layers))


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
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = int(num_classes)
        self.input_size = None if input_size is None else int(input_size)
        self.input_shape = None
        self.is_target = getattr(self.preset, "kind", None) == "target"
        if budget_bytes is None and self.is_target:
            budget_bytes = self.preset.budget_bytes        # the preset's own budget, if it has one
        self.budget_bytes = None if budget_bytes is None else int(budget_bytes)
        self.n_tasks = max(1, int(n_tasks))
        self.seed = int(seed)
        self.trainers: Dict[str, Any] = {}
        self.max_rows: Optional[int] = None

    # ------------------------------------------------------------------ settings
    @property
    def batch_size(self) -> int:
        return int(self.preset.settings["batch_size"])

    @property
    def epochs(self) -> int:
        return max(1, int(math.ceil(float(self.preset.settings["epochs"]))))

    def describe(self) -> dict:
        if self.is_target:
            return {"config": self.config.describe(), "preset_path": self.preset.path, "kind": "target",
                    "batch_size": self.batch_size, "epochs": self.epochs, "budget_bytes": self.budget_bytes,
                    "tasks": {k: t.describe() for k, t in sorted(self.trainers.items())}}
        return {"config": self.config.describe(), "preset_path": self.preset.path, "n_blocks": self.preset.n_blocks,
                "batch_size": self.batch_size, "epochs": self.epochs, "readout": repr(self.preset.readout),
                "max_rows": self.max_rows, "budget_bytes": self.budget_bytes, "tasks": sorted(self.trainers)}

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
            raise ValueError(f"label {bad} is outside the model's {self.num_classes} classes (num_classes="
                             f"{self.num_classes}); pass num_classes >= {int(y.max()) + 1}")
        return y

    # ------------------------------------------------------------------ models
    @staticmethod
    def task_key(task) -> str:
        return f"task{int(task)}"

    def _cap_preset(self, d_in: int):
        """The preset with the row cap the budget allows (or the preset itself).

        The rows the budget holds, ``R = (budget - other state) // bytes per row``, are rounded
        down to whole 256-row quanta of capacity ``C``; ``max_rows = C - batch`` so that the
        allocated capacity (``max_rows + batch`` rows, what a step needs) stays within the
        budget too. A budget below one quantum plus a batch keeps ``max_rows = R`` (rows in use
        within the budget, one quantum allocated)."""
        if self.budget_bytes is None:
            return self.preset
        from growmem.memory import ROW_QUANTUM

        per_task = self.budget_bytes // self.n_tasks
        per_row = bytes_per_row(self.preset, d_in, self.num_classes)

        def rows_for(other: int) -> int:
            r = (per_task - other) // per_row
            if r < 1:
                raise ValueError(f"memory budget {self.budget_bytes} B ({per_task} B per task) does not hold the "
                                 f"model's fixed state ({other} B) plus one row ({per_row} B, d_in={d_in}, "
                                 f"d_out={self.num_classes}); raise the budget")
            c = (r // ROW_QUANTUM) * ROW_QUANTUM
            return c - self.batch_size if c - self.batch_size >= 1 else r

        # the model's other state (parameters, optimizer, policy states) does not depend on max_rows:
        # measure it once on a model with the cap
        other = self._other_bytes(with_row_cap(self.preset, 1, self.config.on_full), d_in)
        max_rows = rows_for(other)
        self.max_rows = int(max_rows)
        return with_row_cap(self.preset, max_rows, self.config.on_full)

    def _other_bytes(self, preset, d_in: int) -> int:
        from .memory_bytes import growmem_bytes
        import jax

        t = preset.trainer(np.zeros((1, d_in), np.float32), self.num_classes, rng=jax.random.key(0))
        b = growmem_bytes({"probe": t})
        return b["bytes_in_use"] - b["rows_in_use_bytes"]

    def trainer_for(self, task: int, d_in: Optional[int] = None):
        """The model of ``task`` (built on first use)."""
        key = self.task_key(task)
        if key not in self.trainers:
            import jax

            d_in = int(d_in or self.input_size)
            if self.is_target:
                per_task = None if self.budget_bytes is None else self.budget_bytes // self.n_tasks
                self.trainers[key] = self.preset.memory(d_in, self.num_classes, budget_bytes=per_task,
                                                        seed=self.seed * 1000 + int(task))
                return self.trainers[key]
            preset = self._cap_preset(d_in)
            rng = jax.random.fold_in(jax.random.key(self.seed), int(task))
            self.trainers[key] = preset.trainer(np.zeros((1, d_in), np.float32), self.num_classes, rng=rng)
        return self.trainers[key]

    # ------------------------------------------------------------------ train / predict
    def step(self, x, y, t=None) -> dict:
        """One growmem step per task label present in the batch (its samples, in batch order)."""
        x = self.as_inputs(x)
        y = self.check_labels(y)
        tasks = np.zeros(len(x), np.int64) if t is None else np.asarray(t).reshape(-1)
        out = {}
        for task in np.unique(tasks):
            idx = np.flatnonzero(tasks == task)
            tr = self.trainer_for(int(task), x.shape[1])
            sel = slice(None) if len(idx) == len(x) else idx
            out[self.task_key(task)] = tr.observe(x[sel], y[sel]) if self.is_target else tr.step(x[sel], y[sel])
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
        if self.is_target:
            return {f"{k}/regime{j}": n for k, t in self.trainers.items() for j, n in enumerate(t.rows_per_regime())}
        return {f"{k}/{layer}": n for k, t in self.trainers.items() for layer, n in t.rows_in_use().items()}

    def memory_bytes(self) -> dict:
        from .memory_bytes import growmem_bytes, target_bytes
        return target_bytes(self.trainers) if self.is_target else growmem_bytes(self.trainers)

    # ------------------------------------------------------------------ checkpoints
    def save(self, checkpointer, step: int, *, data_position=None, extra=None, config=None) -> int:
        """Save every task model's state with the core ``Checkpointer`` (one checkpoint)."""
        state = {k: (t.state() if self.is_target else t.state) for k, t in self.trainers.items()}
        extra = {**(extra or {}), "learner": {"tasks": sorted(self.trainers), "input_size": self.input_size,
                                              "input_shape": list(self.input_shape or ()),
                                              "max_rows": self.max_rows}}
        return checkpointer.save(state if state else None, step, data_position=data_position, extra=extra,
                                 config=config)

    def restore(self, checkpointer, step: Optional[int] = None, *, config=None):
        """Restore the models saved by :meth:`save` (builds them first); returns ``Restored``."""
        meta = checkpointer.read_meta(step)
        info = (meta.get("extra") or {}).get("learner", {})
        if info.get("input_size") is not None:
            self.input_size = int(info["input_size"])
            self.input_shape = tuple(info.get("input_shape") or (self.input_size,))
        for key in info.get("tasks", []):
            self.trainer_for(int(key[len("task"):]), self.input_size)
        if self.is_target:
            return self._restore_target(checkpointer, meta, config)
        template = {k: t.state for k, t in self.trainers.items()} or None
        r = checkpointer.restore(template, step, config=config)
        for k, t in self.trainers.items():
            t.set_state(r.state[k])
        return r

    def _restore_target(self, checkpointer, meta, config):
        """Target memories hold rows of any count: read the saved arrays by path (checked
        against their checksums) instead of into a template of fixed shapes."""
        from growmem.checkpoint import ConfigMismatchError, Restored
        from growmem.checkpoint.manager import diff

        step = int(meta["step"])
        if config is not None and meta.get("config") is not None:
            import json
            diffs = diff(meta["config"], json.loads(json.dumps(config, default=repr)))
            if diffs:
                raise ConfigMismatchError(f"checkpoint step {step} in {checkpointer.directory} was written with a "
                                          f"different config: " + "; ".join(diffs))
        arrays = checkpointer.read_arrays(step, meta)
        states: Dict[str, dict] = {}
        for entry in meta["leaves"]:
            task, _, name = entry["path"].partition("/")
            states.setdefault(task, {})[name] = arrays[entry["host"]]
        for key, t in self.trainers.items():
            t.load_state(states[key])
        return Restored(step=step, state=None, rng=None, data_position=meta.get("data_position"),
                        config=meta.get("config"), policy=meta.get("policy"), extra=meta.get("extra"), meta=meta,
                        stores={})
