"""Memory in bytes, every method counted the same way: the arrays a method holds to keep
learning, at the dtype it holds them.

**growmem** (:func:`growmem_bytes`): every growing layer's rows ``(w, k, ṽ, born)`` at their
stored dtypes — ``rows_in_use_bytes`` counts the rows in use (``size``), ``rows_allocated_bytes``
the whole preallocated capacity (padding included) — plus the parameters, the optimizer state,
the policy states, the hybrid optimizer states (their per-row moments follow the same in-use /
allocated split), the frozen variables and every memory's two scalars (``size``, ``t``).
``bytes_in_use`` = rows in use + the rest; ``bytes_allocated`` = capacity + the rest.

**PyTorch strategies** (:func:`torch_strategy_bytes`): the model's parameters and buffers, the
optimizer state (SGD momentum buffers), and what each continual-learning method stores:

* replay (``ReplayPlugin``) and GDumb (``GDumbPlugin``): the samples in the buffer, each counted as a
  user would store it (:func:`stored_sample_bytes`: with ``replay_dtype="uint8"``, the default, an
  8-bit image as its uint8 pixels and the class — and task — label as one byte each; with
  ``"float32"``, the tensors the data loader yields: float32 inputs, int64 labels), plus GDumb's copy
  of the initial model;
* EWC (``EWCPlugin``): the saved parameters and the importances (Fisher diagonals) of every
  experience kept;
* LwF (``LwFPlugin``): the previous model (parameters and buffers);
* Cumulative: every sample of every experience seen (its cumulative dataset);
* Joint: every sample of the stream (both at the same bytes per sample as replay).

Buffers hold indices into the stream's datasets in Avalanche, but a learner deployed on a stream
must keep the samples themselves, so they are counted as samples. For the PyTorch strategies
``bytes_in_use == bytes_allocated`` (no preallocated padding).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .errors import ConfigError, WrongTypeError


def _nbytes(tree) -> int:
    """Bytes of every array leaf of a pytree (jax or numpy arrays; PRNG keys by their data)."""
    import jax

    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        if hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            total += int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


def growmem_bytes(trainers: Dict[str, Any]) -> Dict[str, int]:
    """Bytes of growmem ``Trainer``s (``{name: trainer}``); see the module docstring."""
    from flax.traverse_util import flatten_dict

    from growmem import backends, policies
    from growmem.train import layer_key

    out = dict(rows_in_use=0, rows_allocated=0, rows_in_use_bytes=0, rows_allocated_bytes=0, params_bytes=0,
               optimizer_bytes=0, policy_bytes=0, hybrid_in_use_bytes=0, hybrid_allocated_bytes=0, other_bytes=0)
    for trainer in trainers.values():
        state = trainer.state
        mems = trainer.memories()
        for path, mem in mems.items():
            per_row = mem.row_bytes                     # w, k, ṽ, born at their stored dtypes
            n, cap = backends.of(mem).rows_in_use(mem), mem.capacity
            out["rows_in_use"] += n
            out["rows_allocated"] += cap
            out["rows_in_use_bytes"] += n * per_row
            out["rows_allocated_bytes"] += cap * per_row
            out["other_bytes"] += _nbytes((mem.size, mem.t))
        out["params_bytes"] += _nbytes(state.params)
        out["optimizer_bytes"] += _nbytes(state.opt_state)
        caps = {layer_key(p): (backends.of(m).hot_rows(m), m.capacity) for p, m in mems.items()}
        for key, pstate in (state.policy_state or {}).items():
            n, cap = caps.get(key, (0, -1))
            per_row = policies.row_state_leaves(pstate, cap)      # e.g. a hybrid layer's Adam moments
            row_b = sum(_nbytes(a) for a in per_row)
            out["hybrid_in_use_bytes"] += row_b * n // cap if cap > 0 else 0
            out["hybrid_allocated_bytes"] += row_b
            out["policy_bytes"] += _nbytes(pstate) - row_b
        # the frozen collections (e.g. W0 of linear layers), everything but the memories
        flat = flatten_dict(dict(state.collections), sep="/")
        out["other_bytes"] += sum(_nbytes(v) for k, v in flat.items() if not k.startswith("memory/"))
        out["other_bytes"] += _nbytes(state.step)
    rest = out["params_bytes"] + out["optimizer_bytes"] + out["policy_bytes"] + out["other_bytes"]
    out["bytes_in_use"] = out["rows_in_use_bytes"] + out["hybrid_in_use_bytes"] + rest
    out["bytes_allocated"] = out["rows_allocated_bytes"] + out["hybrid_allocated_bytes"] + rest
    return out


# ----------------------------------------------------------------------------- PyTorch

def target_bytes(memories: Dict[str, Any]) -> Dict[str, int]:
    """Bytes of growmem target memories (``{name: TargetMemory}``): rows in use (w, k, ṽ, born at
    their stored dtypes) and as allocated, the key spaces' state (subspace bases, the buffer of
    inputs waiting for one), the learned T and the step."""
    keys = ("rows_in_use", "rows_in_use_bytes", "rows_allocated_bytes", "key_space_bytes", "other_bytes",
            "bytes_in_use", "bytes_allocated")
    out = dict.fromkeys(keys, 0)
    for m in memories.values():
        for k, v in m.nbytes().items():
            out[k] += int(v)
    return out


def _tensor_bytes(t) -> int:
    return int(t.numel()) * int(t.element_size())


def module_bytes(module) -> int:
    """Parameters and buffers of a ``torch.nn.Module`` (each tensor once)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += _tensor_bytes(t)
    return total


def optimizer_bytes(optimizer) -> int:
    """Tensors of a ``torch.optim.Optimizer``'s state (e.g. SGD momentum buffers)."""
    import torch

    if optimizer is None:
        return 0
    total = 0
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                total += _tensor_bytes(v)
    return total


def _item_bytes(x) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return _tensor_bytes(x)
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (bool, int, float, np.integer, np.floating)):
        return 8  # collated to an int64 / float64 tensor
    if isinstance(x, (list, tuple)):
        return sum(_item_bytes(v) for v in x)
    raise WrongTypeError(f"cannot count the bytes of a sample element of type {type(x).__name__}")


def sample_bytes(dataset) -> int:
    """Bytes of one sample as the dataset yields it (all samples of a dataset share a shape)."""
    if len(dataset) == 0:
        return 0
    return _item_bytes(dataset[0])


def dataset_bytes(dataset) -> int:
    """``len(dataset) ×`` :func:`sample_bytes` (0 for an empty or missing dataset)."""
    if dataset is None or len(dataset) == 0:
        return 0
    return len(dataset) * sample_bytes(dataset)


def _param_data_bytes(d) -> int:
    total = 0
    for per_exp in d.values():
        for pd in per_exp.values():
            data = getattr(pd, "data", pd)
            total += _tensor_bytes(data)
    return total


REPLAY_DTYPES = ("uint8", "float32")


def stored_sample_bytes(n_features: int, n_classes: int, *, uint8_inputs: bool, task_labels: bool = False,
                        replay_dtype: str = "uint8") -> Optional[int]:
    """Bytes of one stored sample as a user keeps it: ``replay_dtype="uint8"`` — the input at one byte a
    feature when the stream's inputs are 8-bit images (``uint8_inputs``; else at float32, the smallest
    lossless type), the class label in the smallest unsigned type that holds ``n_classes``, and the task
    label in one byte on a task-incremental stream. ``"float32"``: None, meaning the tensors the
    dataset yields (:func:`dataset_bytes`)."""
    if replay_dtype not in REPLAY_DTYPES:
        raise ConfigError(f"replay_dtype must be one of {', '.join(REPLAY_DTYPES)}, got {replay_dtype!r}")
    if replay_dtype == "float32":
        return None
    label = 1 if n_classes <= 1 << 8 else 2 if n_classes <= 1 << 16 else 4
    return int(n_features) * (1 if uint8_inputs else 4) + label + (1 if task_labels else 0)


def _samples_bytes(dataset, sample_bytes: Optional[int]) -> int:
    if dataset is None or len(dataset) == 0:
        return 0
    return len(dataset) * sample_bytes if sample_bytes is not None else dataset_bytes(dataset)


def torch_strategy_bytes(strategy, sample_bytes: Optional[int] = None) -> Dict[str, int]:
    """Bytes of an Avalanche PyTorch strategy; see the module docstring. ``sample_bytes``: the bytes of
    one stored sample (:func:`stored_sample_bytes`; None: as the dataset yields it)."""
    from avalanche.training.plugins import EWCPlugin, GDumbPlugin, LwFPlugin, ReplayPlugin

    parts = {"params_bytes": module_bytes(strategy.model), "optimizer_bytes": optimizer_bytes(
        getattr(strategy, "optimizer", None)), "buffer_bytes": 0, "buffer_samples": 0, "regularizer_bytes": 0}
    from .baselines import OnlineReplay

    for p in strategy.plugins:
        if isinstance(p, OnlineReplay):
            parts["buffer_bytes"] += p.nbytes()
            parts["buffer_samples"] += p.size
        elif isinstance(p, (ReplayPlugin, GDumbPlugin)):
            buf = p.storage_policy.buffer
            parts["buffer_bytes"] += _samples_bytes(buf, sample_bytes)
            parts["buffer_samples"] += len(buf)
            if isinstance(p, GDumbPlugin) and p.init_model is not None:
                parts["regularizer_bytes"] += module_bytes(p.init_model)
        elif isinstance(p, EWCPlugin):
            parts["regularizer_bytes"] += _param_data_bytes(p.saved_params) + _param_data_bytes(p.importances)
        elif isinstance(p, LwFPlugin):
            prev = p.lwf.prev_model
            if prev is not None:
                parts["regularizer_bytes"] += module_bytes(prev)
    from avalanche.training.supervised import Cumulative, JointTraining

    if isinstance(strategy, Cumulative):
        ds = getattr(strategy, "dataset", None)
        parts["buffer_bytes"] += _samples_bytes(ds, sample_bytes)
        parts["buffer_samples"] += 0 if ds is None else len(ds)
    elif isinstance(strategy, JointTraining):
        for exp in getattr(strategy, "_experiences", []) or []:
            parts["buffer_bytes"] += _samples_bytes(exp.dataset, sample_bytes)
            parts["buffer_samples"] += len(exp.dataset)
    total = parts["params_bytes"] + parts["optimizer_bytes"] + parts["buffer_bytes"] + parts["regularizer_bytes"]
    return {**parts, "bytes_in_use": total, "bytes_allocated": total}


def strategy_bytes(strategy, sample_bytes: Optional[int] = None) -> Dict[str, int]:
    """Bytes of a growmem strategy (its learner) or of any Avalanche PyTorch strategy."""
    learner = getattr(strategy, "learner", None)
    if learner is not None:
        return learner.memory_bytes()
    return torch_strategy_bytes(strategy, sample_bytes)
