"""Orbax checkpoints of everything a run needs to resume exactly.

A checkpoint holds, for one step:

* the trainer state: ``step``, parametric ``params``, optimizer state, every
  frozen variable, and each growing layer's hot rows (only the ``size`` rows in
  use; the capacity is recorded so the restored memory has the same shape and
  therefore compiles to the same program — this is what makes resuming bitwise);
* any extra pytree that is part of ``trainer.state`` (e.g. a policy state);
* the run's RNG key and data-order position (whatever JSON the caller passes);
* tiered memories (:mod:`growmem.storage.tiered`): hot rows as arrays, the cold
  tier *by reference* — its URL, generation and the number of cold rows at save
  time, so a checkpoint never points at rows written after it;
* sharded memories (:mod:`growmem.storage.sharded`): the row arrays ``w, k, v,
  born`` as *global* ``jax.Array``s (whole capacity, ``S·C`` rows), so in a
  multi-process run every process writes only its own shards and nothing is
  gathered to one host; rows per shard, clock, placement, next shard, spec and
  capacity per shard go in the JSON description, with a CRC32 of every shard;
* a JSON description (format version, created-at, per-layer rows, bytes,
  kernels, temperatures, policy, user config, CRC32 of every array).

Saves go through ``orbax.checkpoint.CheckpointManager``: a step is written to a
temporary directory and renamed when complete, so an interrupted save leaves
the previous checkpoint loadable; the manager keeps the last ``keep`` steps.

>>> ckpt = Checkpointer("runs/a/ckpt", keep=3)
>>> ckpt.save(trainer, rng=key, data_position={"epoch": 0, "batch": 17})
>>> restored = ckpt.restore(trainer)        # latest step; trainer.state is replaced
>>> restored.step, restored.rng, restored.data_position

Sharded memories (every process of a ``jax.distributed`` run calls both; the JSON
description and the small numpy arrays are written by process 0 only, by Orbax):

>>> ckpt.save(None, step, sharded={"mem": sm})
>>> sm = ckpt.restore(sharded_mesh=row_mesh()).sharded["mem"]   # or sharded_mesh={"mem": mesh}

Each shard is read straight onto its device of the target mesh (Orbax
``ArrayRestoreArgs`` with the mesh's ``NamedSharding``) and its CRC32 checked by
the process that holds it. Restoring onto a mesh with a *different number of
shards* re-distributes the rows (gathered in shard order, then placed by the
memory's placement rule over the new shards, as :meth:`ShardedMemory.from_memory`
does) in a single process; in a multi-process run it raises
:class:`ConfigMismatchError` naming both shard counts. ``sharded_specs={name:
spec}`` checks each layer's spec against the saved one (``ConfigMismatchError``
naming what differs); without it the spec is rebuilt from the JSON (a spec holding a
policy must be passed). Checkpoints with sharded layers are format version 2 (older
growmem refuses them clearly); all others stay version 1.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import zlib
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import memory as memlib

FORMAT_NAME = "growmem-checkpoint"
#: bump when the on-disk layout changes incompatibly
FORMAT_VERSION = 1
#: written instead of FORMAT_VERSION when a checkpoint holds sharded memories (which older readers cannot restore)
SHARDED_FORMAT_VERSION = 2
READABLE_VERSIONS = (FORMAT_VERSION, SHARDED_FORMAT_VERSION)
MEMORY_FIELDS = ("w", "k", "v", "born")
META_ITEM = "meta"
STATE_ITEM = "state"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read."""


class IncompatibleVersionError(CheckpointError):
    """The checkpoint was written in a format this version of growmem cannot read."""


class CorruptCheckpointError(CheckpointError):
    """A file of the checkpoint is missing, truncated or does not match its checksum."""


class ConfigMismatchError(CheckpointError):
    """The checkpoint was written by a model with a different configuration."""


class Restored(NamedTuple):
    """What :meth:`Checkpointer.restore` returns besides the state it installs."""

    step: int
    state: Any             # the restored TrainState (also installed into the trainer)
    rng: Any               # the saved PRNG key (or None)
    data_position: Any     # whatever JSON the caller saved
    config: Any            # the saved user config (JSON)
    policy: Any            # the saved policy description (JSON)
    extra: Any             # the saved extra JSON
    tiers: Dict[str, Any]  # name -> restored TieredMemory
    meta: dict             # the full JSON description
    sharded: Dict[str, Any] = {}  # name -> restored ShardedMemory (when restore got sharded_mesh)


# ----------------------------------------------------------------------------- helpers

def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_str(path) -> str:
    """``('params', 'Dense_0', 'kernel')``-like key path as ``params/Dense_0/kernel``."""
    return "/".join(_key_name(k) for k in path)


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) & 0xFFFFFFFF


_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


def _jsonish(x):
    """A JSON value for a spec field: policies by name and retention, functions by name."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "retention") and hasattr(x, "name") and isinstance(x, tuple):  # growmem.policies.Policy
        return {"policy": str(x.name), "retention": float(x.retention)}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonish(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): _jsonish(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonish(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return _ADDR.sub("", getattr(x, "__qualname__", None) or repr(x))


def spec_to_json(spec) -> Any:
    """A layer spec as JSON (stable across processes: no object addresses)."""
    return _jsonish(spec)


_spec_dict = spec_to_json


def _diff(a, b, prefix="") -> List[str]:
    """Human-readable differences between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{prefix}{k}: missing in checkpoint, current {b[k]!r}")
            elif k not in b:
                out.append(f"{prefix}{k}: checkpoint {a[k]!r}, missing now")
            else:
                out += _diff(a[k], b[k], f"{prefix}{k}.")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += _diff(x, y, f"{prefix}{i}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: checkpoint {a!r}, current {b!r}"]


def _is_trainer(obj) -> bool:
    return hasattr(obj, "state") and callable(getattr(obj, "step", None))


def _state_of(obj):
    """A TrainState from a Trainer (``.state``) or the state itself."""
    return obj.state if _is_trainer(obj) else obj


def _flatten(state):
    return jax.tree_util.tree_flatten_with_path(state, is_leaf=memlib.is_memory)


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_host(x):
    if _is_key(x):
        return np.asarray(jax.random.key_data(x)), str(jax.random.key_impl(x))
    return np.asarray(x), None


def _layer_name(path) -> str:
    """Memory path inside the state (``collections/memory/block_0/rows``) -> ``block_0``."""
    names = [_key_name(k) for k in path]
    if "memory" in names:
        names = names[names.index("memory") + 1:]
    if names and names[-1] == "rows":
        names = names[:-1]
    return "/".join(names) or "memory"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


# ----------------------------------------------------------------------------- save

def _describe_and_pack(state, *, rng=None, tiers=None):
    """Flatten a state into ``(arrays, leaves_meta, memories_meta, tiers_meta, rng_meta)``."""
    arrays: Dict[str, np.ndarray] = {}
    leaves, memories = [], []
    flat, _ = _flatten(state)
    for i, (path, leaf) in enumerate(flat):
        p = path_str(path)
        if memlib.is_memory(leaf):
            n = int(leaf.size)
            name = _layer_name(path)
            entry = {"name": name, "path": p, "size": n, "t": int(leaf.t), "capacity": leaf.capacity,
                     "d_in": leaf.d_in, "d_out": leaf.d_out, "dtype": str(leaf.k.dtype),
                     "spec": _spec_dict(leaf.spec), "rows_hot": n, "rows_cold": 0, "arrays": {}, "crc32": {},
                     "bytes_hot": 0}
            for f in MEMORY_FIELDS:
                # host view first, then slice: slicing the device array would compile a program per size
                a = np.asarray(getattr(leaf, f))[:n]
                entry["bytes_hot"] += int(a.nbytes)
                if n:
                    key = f"mem{i:04d}_{_safe(name)}_{f}"
                    arrays[key] = a
                    entry["arrays"][f] = key
                    entry["crc32"][f] = _crc(a)
            memories.append(entry)
            continue
        a, impl = _to_host(leaf)
        entry = {"path": p, "shape": list(a.shape), "dtype": str(a.dtype), "key_impl": impl}
        if a.size:
            key = f"leaf{i:05d}"
            arrays[key] = a
            entry["array"] = key
            entry["crc32"] = _crc(a)
        leaves.append(entry)
    rng_meta = None
    if rng is not None:
        a, impl = _to_host(rng)
        arrays["rng"] = a
        rng_meta = {"array": "rng", "key_impl": impl, "shape": list(a.shape), "dtype": str(a.dtype),
                    "crc32": _crc(a)}
    tiers_meta = []
    for name, tier in (tiers or {}).items():
        hot, tmeta = tier.checkpoint_state()
        tmeta = dict(tmeta, name=name, arrays={}, crc32={})
        for f, a in hot.items():
            a = np.asarray(a)
            if a.size:
                key = f"tier_{_safe(name)}_{f}"
                arrays[key] = a
                tmeta["arrays"][f] = key
                tmeta["crc32"][f] = _crc(a)
        tiers_meta.append(tmeta)
    return arrays, leaves, memories, tiers_meta, rng_meta


# ----------------------------------------------------------------------------- sharded memories

def spec_from_json(d, where: str = "checkpoint"):
    """Rebuild a :class:`growmem.GrowingSpec` from :func:`spec_to_json`. A spec holding a
    policy cannot be rebuilt from the policy's name: pass the spec instead."""
    from ..layers import GrowingSpec

    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: no layer spec saved; pass it explicitly")
    if d.get("policy") is not None:
        raise CheckpointError(f"{where}: the layer's spec holds policy {d['policy']}, which cannot be rebuilt from "
                              f"JSON; pass the GrowingSpec holding that policy (sharded_specs={{name: spec}})")
    names = {f.name for f in dataclasses.fields(GrowingSpec)}
    kw = {k: v for k, v in d.items() if k in names and k != "policy"}
    kw["hyper"] = tuple(tuple(p) for p in kw.get("hyper", ()))
    try:
        return GrowingSpec(**kw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: the saved layer spec {d} cannot be rebuilt ({e}); pass it explicitly") from e


def _sharded_fields():
    from .sharded import FIELDS

    return FIELDS


def _describe_sharded(sharded):
    """``(global arrays, sharded meta)`` of ``{name: ShardedMemory}``.

    The arrays stay global ``jax.Array``s (Orbax writes each shard from the process that
    holds it). The per-shard CRC32s are computed where the shards live and all-gathered
    (a few int32s) so that process 0 can write them into the JSON description.
    """
    global_arrays, out, seen = {}, [], {}
    for name, sm in (sharded or {}).items():
        safe = _safe(name)
        if safe in seen:
            raise ValueError(f"sharded layers {seen[safe]!r} and {name!r} would share array names; rename one")
        seen[safe] = name
        itemsize = np.dtype(sm.k.dtype).itemsize
        entry = {"name": name, "n_shards": sm.n_shards, "capacity_per_shard": sm.capacity_per_shard,
                 "host_sizes": [int(n) for n in sm.host_sizes], "size": sm.size, "t": int(sm.t),
                 "placement": sm.placement, "next_shard": int(sm.next_shard), "axis": sm.axis, "d_in": sm.d_in,
                 "d_out": sm.d_out, "dtype": str(sm.k.dtype), "spec": spec_to_json(sm.spec),
                 "process_count": jax.process_count(), "arrays": {}, "shapes": {}, "dtypes": {}, "crc32": {},
                 "bytes": sm.size * (itemsize * (1 + sm.d_in + sm.d_out) + 4), "bytes_saved": 0}
        local: Dict[int, list] = {}
        for f in _sharded_fields():
            a = getattr(sm, f)
            key = f"sharded_{safe}_{f}"
            global_arrays[key] = a
            entry["arrays"][f] = key
            entry["shapes"][f] = [int(x) for x in a.shape]
            entry["dtypes"][f] = str(a.dtype)
            entry["bytes_saved"] += int(a.size) * np.dtype(a.dtype).itemsize
            for j, block in sm.local_blocks(f).items():
                local.setdefault(j, []).append(_crc(block))
        # uint32 CRCs travel as int32 (same bits) through the collective
        crcs = sm.allgather_per_shard({j: np.asarray(c, np.uint32).view(np.int32) for j, c in local.items()})
        crcs = np.asarray(crcs, np.int32).view(np.uint32)
        entry["crc32"] = {f: [int(c) for c in crcs[:, i]] for i, f in enumerate(_sharded_fields())}
        out.append(entry)
    return global_arrays, out


def _plan_sharded(meta, sharded_mesh, sharded_specs, where):
    """What to read for each sharded layer being restored (checks meshes and specs first)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import orbax.checkpoint as ocp

    saved = {m["name"]: m for m in meta.get("sharded", [])}
    if sharded_mesh is None:
        if sharded_specs:
            raise ValueError("sharded_specs needs sharded_mesh (the mesh to restore the sharded layers onto)")
        return []
    meshes = {n: sharded_mesh for n in saved} if isinstance(sharded_mesh, Mesh) else dict(sharded_mesh)
    specs = dict(sharded_specs or {})
    unknown = sorted((set(meshes) | set(specs)) - set(saved))
    if unknown:
        raise ConfigMismatchError(f"{where} has no sharded layer {unknown}; it holds {sorted(saved) or 'none'}")
    problems, plans = [], []
    for name, mesh in meshes.items():
        m = saved[name]
        axes = tuple(mesh.axis_names)
        axis = m["axis"] if m["axis"] in axes else (axes[0] if len(axes) == 1 else None)
        if axis is None:
            problems.append(f"sharded layer {name}: the mesh has no axis {m['axis']!r} (axes {axes})")
            continue
        spec = specs.get(name)
        if spec is not None:
            diffs = _diff(m["spec"], spec_to_json(spec))
            if diffs:
                problems.append(f"sharded layer {name}: " + "; ".join(diffs))
                continue
        else:
            spec = spec_from_json(m["spec"], where=f"{where}, sharded layer {name}")
        n_new, n_saved = int(mesh.shape[axis]), int(m["n_shards"])
        if n_new != n_saved and jax.process_count() > 1:
            problems.append(f"sharded layer {name} was saved with {n_saved} shards but the target mesh has {n_new} "
                            f"shards; re-distributing rows to another shard count is single-process only — restore "
                            f"onto a mesh with {n_saved} shards")
            continue
        args = {}
        for f, key in m["arrays"].items():
            if n_new == n_saved:  # each shard straight onto its device of the target mesh
                args[key] = ocp.ArrayRestoreArgs(sharding=NamedSharding(mesh, P(axis)),
                                                 global_shape=tuple(m["shapes"][f]), dtype=np.dtype(m["dtypes"][f]))
            else:  # single process: the whole array to the host, then re-distributed
                args[key] = ocp.RestoreArgs(restore_type=np.ndarray)
        plans.append({"meta": m, "mesh": mesh, "axis": axis, "spec": spec, "args": args})
    if problems:
        raise ConfigMismatchError(f"{where} does not match the requested sharded layers: " + " | ".join(problems))
    return plans


def _check_block(block, crc, where, name, f, j):
    if _crc(block) != crc:
        raise CorruptCheckpointError(f"{where}: sharded layer {name} field {f} shard {j} does not match its checksum "
                                     f"(file truncated or corrupt)")


def _host_rows(m, arrays, verify, where) -> Dict[str, np.ndarray]:
    """All rows in use of a sharded layer, in shard order, from its host (numpy) arrays."""
    cap, sizes = int(m["capacity_per_shard"]), [int(n) for n in m["host_sizes"]]
    out = {}
    for f, key in m["arrays"].items():
        a = np.asarray(arrays[key])
        if verify:
            for j in range(len(sizes)):
                _check_block(a[j * cap:(j + 1) * cap], m["crc32"][f][j], where, m["name"], f, j)
        out[f] = np.concatenate([a[j * cap:j * cap + n] for j, n in enumerate(sizes)])
    return out


def _build_sharded(plan, arrays, *, verify, where):
    from .sharded import ShardedMemory, assign_shards

    m, mesh, axis = plan["meta"], plan["mesh"], plan["axis"]
    n_new = int(mesh.shape[axis])
    if n_new == int(m["n_shards"]):
        sm = ShardedMemory.from_global_arrays(mesh, {f: arrays[k] for f, k in m["arrays"].items()}, m["host_sizes"],
                                              m["t"], spec=plan["spec"], axis=axis, placement=m["placement"],
                                              next_shard=m["next_shard"])
        if verify:  # each process checks the shards it holds
            for f in m["arrays"]:
                for j, block in sm.local_blocks(f).items():
                    _check_block(block, m["crc32"][f][j], where, m["name"], f, j)
        return sm
    rows = _host_rows(m, arrays, verify, where)
    n = int(m["size"])
    shard = assign_shards([0] * n_new, n, m["placement"])
    shard_rows = {j: {f: a[shard == j] for f, a in rows.items()} for j in range(n_new)}
    sm = ShardedMemory.from_shard_rows(mesh, shard_rows, [int((shard == j).sum()) for j in range(n_new)],
                                       d_in=int(m["d_in"]), d_out=int(m["d_out"]), spec=plan["spec"], t=int(m["t"]),
                                       axis=axis, placement=m["placement"], dtype=np.dtype(m["dtype"]))
    sm.next_shard = n % n_new
    return sm


class Checkpointer:
    """Keep the last ``keep`` checkpoints of a run in ``directory`` (created if needed).

    ``directory`` may be any path Orbax accepts (local or e.g. ``gs://``).
    """

    def __init__(self, directory, keep: int = 3, *, create: bool = True):
        import orbax.checkpoint as ocp

        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.fspath(directory)
        if "://" not in self.directory:
            self.directory = os.path.abspath(self.directory)
            if create:
                try:
                    os.makedirs(self.directory, exist_ok=True)
                except OSError as e:
                    raise CheckpointError(f"cannot create checkpoint directory {self.directory}: {e}") from e
                if not os.access(self.directory, os.W_OK):
                    raise CheckpointError(f"checkpoint directory {self.directory} is not writable")
            elif not os.path.isdir(self.directory):
                raise CheckpointError(f"no checkpoint directory at {self.directory}")
        self._ocp = ocp
        opts = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False, create=create)
        # uncompressed: memory rows (floats) barely compress and zstd on one big chunk is the
        # slowest part of a save
        handlers = {STATE_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False),
                    META_ITEM: ocp.JsonCheckpointHandler()}
        self._mgr = ocp.CheckpointManager(self.directory, options=opts, item_handlers=handlers)

    # -- queries
    def all_steps(self) -> List[int]:
        self._mgr.reload()
        return sorted(int(s) for s in self._mgr.all_steps())

    def latest_step(self) -> Optional[int]:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def close(self):
        self._mgr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- save
    def save(self, trainer, step: Optional[int] = None, *, rng=None, data_position=None, config=None,
             policy=None, tiers: Optional[Mapping[str, Any]] = None, extra=None, force: bool = True,
             sharded: Optional[Mapping[str, Any]] = None) -> int:
        """Write one checkpoint; returns its step.

        ``trainer``: a :class:`growmem.Trainer`, a ``TrainState``, or None (then pass ``step``). ``rng``: a PRNG key
        (typed or raw ``uint32``). ``data_position``, ``config``, ``policy`` and ``extra``:
        JSON-serialisable values (the data-order position, the model/run configuration that
        :meth:`restore` checks, a policy description). ``tiers``: ``{name: TieredMemory}``.
        ``sharded``: ``{name: ShardedMemory}``, saved as global arrays (see the module
        docstring); in a multi-process run every process must call ``save`` with the same
        arguments.
        """
        if trainer is None:  # e.g. only tiered memories
            if step is None:
                raise ValueError("save(None, ...) needs an explicit step")
            state = {}
        else:
            state = _state_of(trainer)
        step = int(state.step) if step is None else int(step)
        latest = self.latest_step()
        if latest is not None and step <= latest:  # orbax would skip it silently
            raise CheckpointError(f"cannot save step {step}: {self.directory} already holds step {latest}; "
                                  f"resume from it, or use another directory")
        spill = getattr(trainer, "spill", None)
        if spill is not None:  # a spilling trainer: its cold tiers, by reference
            tiers = {**spill.checkpoint_tiers(), **(tiers or {})}
        arrays, leaves, memories, tiers_meta, rng_meta = _describe_and_pack(state, rng=rng, tiers=tiers)
        global_arrays, sharded_meta = _describe_sharded(sharded)
        import growmem

        meta = {
            "format": FORMAT_NAME, "format_version": SHARDED_FORMAT_VERSION if sharded_meta else FORMAT_VERSION,
            "growmem_version": growmem.__version__,
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "step": step, "leaves": leaves, "memories": memories, "tiers": tiers_meta, "rng": rng_meta,
            "data_position": data_position, "config": config, "policy": policy, "extra": extra,
            "bytes": int(sum(a.nbytes for a in arrays.values()) + sum(m["bytes_saved"] for m in sharded_meta)),
        }
        if sharded_meta:
            meta["sharded"] = sharded_meta
        try:
            json.dumps(meta)
        except TypeError as e:
            raise CheckpointError(f"data_position, config, policy and extra must be JSON-serialisable: {e}") from e
        ocp = self._ocp
        items = {META_ITEM: ocp.args.JsonSave(meta)}
        if arrays or global_arrays:
            # numpy arrays are written by process 0; global jax.Arrays shard by shard, by their owners
            items[STATE_ITEM] = ocp.args.PyTreeSave({**arrays, **global_arrays})
        try:
            self._mgr.save(step, args=ocp.args.Composite(**items), force=force)
            self._mgr.wait_until_finished()
        except OSError as e:
            raise CheckpointError(f"saving step {step} to {self.directory} failed ({e}); "
                                  f"the previous checkpoints are untouched") from e
        return step

    # -- restore
    def read_meta(self, step: Optional[int] = None) -> dict:
        """The JSON description of a checkpoint (latest by default), after the version check."""
        step = self._pick(step)
        path = Path(self.directory) / str(step) / META_ITEM / "metadata"
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:
            raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory} has no {META_ITEM}/metadata "
                                         f"file: not a growmem checkpoint, or it is incomplete") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(f"{path} is truncated or corrupt: {e}") from None
        check_version(meta, where=str(path))
        return meta

    def _pick(self, step):
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        if int(step) not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; have {steps}")
        return int(step)

    def _read_arrays(self, step: int, meta: dict, sharded_args: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """The host (numpy) arrays of ``meta``, plus the sharded arrays named in ``sharded_args``
        (``{array name: orbax RestoreArgs}``; the other sharded arrays are not read)."""
        names = [e["array"] for e in meta["leaves"] if "array" in e]
        names += [a for m in meta["memories"] for a in m["arrays"].values()]
        names += [a for t in meta["tiers"] for a in t["arrays"].values()]
        if meta.get("rng"):
            names.append(meta["rng"]["array"])
        sharded_args = dict(sharded_args or {})
        if not names and not sharded_args:
            return {}
        ocp = self._ocp
        host = ocp.RestoreArgs(restore_type=np.ndarray)
        restore_args = {**{n: host for n in names}, **sharded_args}
        n_saved = len(names) + sum(len(m["arrays"]) for m in meta.get("sharded", []))
        try:
            args = ocp.args.PyTreeRestore(item={n: 0 for n in restore_args}, restore_args=restore_args,
                                          partial_restore=len(restore_args) < n_saved)
            out = self._mgr.restore(step, args=ocp.args.Composite(**{STATE_ITEM: args}))
            arrays = {k: (v if k in sharded_args else np.asarray(v)) for k, v in out[STATE_ITEM].items()}
        except Exception as e:  # orbax/tensorstore raise many types for damaged files
            raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory} cannot be read — a file is "
                                         f"missing or truncated: {type(e).__name__}: {e}") from e
        missing = [n for n in restore_args if n not in arrays]
        if missing:
            raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory} lacks arrays {missing}")
        return arrays

    def restore(self, trainer=None, step: Optional[int] = None, *, config=None, tiers_dir=None,
                tier_specs: Optional[Mapping[str, Any]] = None, sharded_mesh=None,
                sharded_specs: Optional[Mapping[str, Any]] = None, verify: bool = True) -> Restored:
        """Restore a checkpoint (latest by default) into ``trainer``.

        ``trainer`` (a :class:`growmem.Trainer`, or a ``TrainState`` used as a template)
        must be built from the same model configuration: a different set of variables,
        a shape, a dtype, or a layer's spec (kernel, temperature, rule...) raise
        :class:`ConfigMismatchError` naming what differs. If ``config`` is given it is
        compared with the config saved with the checkpoint in the same way. With a
        Trainer the state is installed into it (and its capacity bookkeeping reset).
        Tiered memories are reopened at their saved rows (``tiers_dir`` overrides the saved
        location, e.g. after moving the run: tier ``name`` is then read from ``tiers_dir/name``; ``tier_specs[name]`` supplies the GrowingSpec of a
        layer whose spec holds a policy).

        Sharded memories are restored when ``sharded_mesh`` is given: a ``Mesh`` (every
        sharded layer onto it) or ``{name: Mesh}`` (only those layers). Each shard is read
        onto its device of the mesh; ``sharded_specs[name]`` is checked against the saved
        spec. See the module docstring for restoring onto a different number of shards.
        In a multi-process run every process must call ``restore`` with the same arguments.
        """
        step = self._pick(step)
        meta = self.read_meta(step)
        if config is not None and meta.get("config") is not None:
            diffs = _diff(meta["config"], json.loads(json.dumps(config, default=repr)))
            if diffs:
                raise ConfigMismatchError(f"checkpoint step {step} in {self.directory} was written with a different "
                                          f"config: " + "; ".join(diffs))
        where = f"checkpoint step {step} in {self.directory}"
        plan = _plan_sharded(meta, sharded_mesh, sharded_specs, where)
        arrays = self._read_arrays(step, meta, {k: a for p in plan for k, a in p["args"].items()})
        if verify:
            _verify(arrays, meta, where=where)
        sharded = {p["meta"]["name"]: _build_sharded(p, arrays, verify=verify, where=where) for p in plan}
        state = None
        if trainer is not None:
            state = _rebuild(_state_of(trainer), arrays, meta, where=f"checkpoint step {step} in {self.directory}")
            if _is_trainer(trainer):
                if hasattr(trainer, "set_state"):  # a growmem Trainer: resets its capacity bookkeeping too
                    trainer.set_state(state)
                else:
                    trainer.state = state
        rng = None
        if meta.get("rng"):
            r = meta["rng"]
            a = arrays[r["array"]]
            rng = jax.random.wrap_key_data(a, impl=r["key_impl"]) if r.get("key_impl") else jnp.asarray(a)
        tiers = {}
        spill = getattr(trainer, "spill", None)
        if spill is not None:  # the specs of the spilling layers (they may hold policies)
            tier_specs = {**spill.tier_specs(), **(tier_specs or {})}
        if meta["tiers"]:
            from .tiered import TieredMemory

            for t in meta["tiers"]:
                hot = {f: arrays[k] for f, k in t["arrays"].items()}
                where = tiers_dir if tiers_dir is None else os.path.join(os.fspath(tiers_dir), t["name"])
                tiers[t["name"]] = TieredMemory.from_checkpoint(hot, t, directory=where,
                                                                spec=(tier_specs or {}).get(t["name"]))
        if spill is not None:
            spill.adopt({t["name"]: tiers[t["name"]] for t in meta["tiers"] if "spill" in t}, meta["tiers"])
        elif any("spill" in t for t in meta["tiers"]) and _is_trainer(trainer):
            raise CheckpointError(f"checkpoint step {step} in {self.directory} is of a run whose oldest rows spilled "
                                  f"to disk; call trainer.enable_spill(DIR, ram_budget_bytes=..., resume=True) "
                                  f"before restoring it")
        return Restored(step=step, state=state, rng=rng, data_position=meta.get("data_position"),
                        config=meta.get("config"), policy=meta.get("policy"), extra=meta.get("extra"),
                        tiers=tiers, meta=meta, sharded=sharded)


def check_version(meta: dict, where: str = "checkpoint"):
    fmt, ver = meta.get("format"), meta.get("format_version")
    if fmt != FORMAT_NAME:
        raise IncompatibleVersionError(f"{where}: not a growmem checkpoint (format {fmt!r})")
    if ver not in READABLE_VERSIONS:
        raise IncompatibleVersionError(f"{where}: checkpoint format version {ver} is incompatible with this "
                                       f"growmem (reads format version {' or '.join(map(str, READABLE_VERSIONS))})")


def _verify(arrays, meta, where):
    def check(key, crc, what):
        if crc is not None and _crc(arrays[key]) != crc:
            raise CorruptCheckpointError(f"{where}: {what} does not match its checksum (file truncated or corrupt)")

    for e in meta["leaves"]:
        if "array" in e:
            check(e["array"], e.get("crc32"), e["path"])
    for m in meta["memories"]:
        for f, key in m["arrays"].items():
            check(key, m["crc32"].get(f), f"memory {m['name']} field {f}")
    for t in meta["tiers"]:
        for f, key in t["arrays"].items():
            check(key, t["crc32"].get(f), f"tier {t['name']} field {f}")
    if meta.get("rng"):
        check(meta["rng"]["array"], meta["rng"].get("crc32"), "rng")


def _rebuild(template, arrays, meta, where):
    """Put the saved arrays into the structure of ``template`` (checking it matches)."""
    flat, treedef = _flatten(template)
    saved_leaves = {e["path"]: e for e in meta["leaves"]}
    saved_mems = {m["path"]: m for m in meta["memories"]}
    cur_paths = {path_str(p) for p, _ in flat}
    problems = []
    missing = sorted((set(saved_leaves) | set(saved_mems)) - cur_paths)
    extra = sorted(cur_paths - set(saved_leaves) - set(saved_mems))
    if missing:
        problems.append(f"variables in the checkpoint but not in the model: {missing}")
    if extra:
        problems.append(f"variables in the model but not in the checkpoint: {extra}")
    # per-row leaves outside the memories (e.g. a hybrid layer's Adam moments) follow the
    # memory's capacity, which may have grown since the template was built
    cap_map = {}
    for path, leaf in flat:
        m = saved_mems.get(path_str(path))
        if memlib.is_memory(leaf) and m is not None:
            cap_map.setdefault(leaf.capacity, set()).add(m["capacity"])
    out = []
    for path, leaf in flat:
        p = path_str(path)
        if memlib.is_memory(leaf):
            m = saved_mems.get(p)
            if m is None:
                out.append(leaf)
                continue
            diffs = _diff(m["spec"], _spec_dict(leaf.spec))
            if (m["d_in"], m["d_out"]) != (leaf.d_in, leaf.d_out):
                diffs.append(f"(d_in, d_out): checkpoint {(m['d_in'], m['d_out'])}, current {(leaf.d_in, leaf.d_out)}")
            if m["dtype"] != str(leaf.k.dtype):
                diffs.append(f"dtype: checkpoint {m['dtype']}, current {leaf.k.dtype}")
            if diffs:
                problems.append(f"layer {m['name']}: " + "; ".join(diffs))
                out.append(leaf)
                continue
            n, cap = m["size"], m["capacity"]
            fields = {}
            for f in MEMORY_FIELDS:
                cur = getattr(leaf, f)
                buf = np.zeros((cap,) + tuple(cur.shape[1:]), np.dtype(cur.dtype))
                if n:
                    buf[:n] = arrays[m["arrays"][f]]
                fields[f] = jnp.asarray(buf)
            out.append(leaf.replace(size=jnp.asarray(n, leaf.size.dtype), t=jnp.asarray(m["t"], leaf.t.dtype),
                                    **fields))
            continue
        e = saved_leaves.get(p)
        if e is None:
            out.append(leaf)
            continue
        cur, impl = _to_host(leaf) if not isinstance(leaf, (int, float)) else (np.asarray(leaf), None)
        row_leaf = (cur.ndim >= 1 and len(e["shape"]) == cur.ndim and list(cur.shape[1:]) == e["shape"][1:]
                    and e["shape"][0] in cap_map.get(cur.shape[0], ()))
        if (list(cur.shape) != e["shape"] and not row_leaf) or str(cur.dtype) != e["dtype"]:
            problems.append(f"{p}: checkpoint {e['dtype']}{tuple(e['shape'])}, current {cur.dtype}{cur.shape}")
            out.append(leaf)
            continue
        a = arrays[e["array"]] if "array" in e else np.zeros(e["shape"], e["dtype"])
        if e.get("key_impl"):
            out.append(jax.random.wrap_key_data(jnp.asarray(a), impl=e["key_impl"]))
        elif isinstance(leaf, np.ndarray):
            out.append(np.array(a))
        elif isinstance(leaf, (int, float, np.generic)):
            out.append(type(leaf)(a.item()) if not isinstance(leaf, np.generic) else a.astype(leaf.dtype)[()])
        else:
            out.append(jnp.asarray(a, dtype=leaf.dtype))
    if problems:
        raise ConfigMismatchError(f"{where} does not match the current model configuration: " + " | ".join(problems))
    return jax.tree_util.tree_unflatten(treedef, out)


# ----------------------------------------------------------------------------- inspect / export

def _open(directory) -> Checkpointer:
    return Checkpointer(directory, keep=None, create=False)


def inspect(directory, step: Optional[int] = None) -> dict:
    """A summary of a checkpoint (latest by default) from its JSON description alone."""
    ck = _open(directory)
    try:
        meta = ck.read_meta(step)
        layers = []
        for m in meta["memories"]:
            spec = m.get("spec") or {}
            layers.append({"layer": m["name"], "rows": m["size"], "hot": m["rows_hot"], "cold": m["rows_cold"],
                           "capacity": m["capacity"], "d_in": m["d_in"], "d_out": m["d_out"],
                           "bytes": m["bytes_hot"], "kernel": spec.get("kernel") if isinstance(spec, dict) else None,
                           "temperature": spec.get("temperature") if isinstance(spec, dict) else None})
        by_name = {l["layer"]: l for l in layers}
        for t in meta["tiers"]:
            if "spill" in t and t["name"] in by_name:  # a trainer's layer whose oldest rows spilled
                l = by_name[t["name"]]
                l.update(rows=l["hot"] + t["rows_cold"], cold=t["rows_cold"], bytes=l["bytes"] + t["bytes_cold"],
                         cold_url=t.get("url"), generation=t.get("generation"))
                continue
            layers.append({"layer": t["name"], "rows": t["rows_hot"] + t["rows_cold"], "hot": t["rows_hot"],
                           "cold": t["rows_cold"], "capacity": None, "d_in": t["d_in"], "d_out": t["d_out"],
                           "bytes": t["bytes_hot"] + t["bytes_cold"], "kernel": t.get("kernel"),
                           "temperature": t.get("temperature"), "cold_url": t.get("url"),
                           "generation": t.get("generation")})
        for m in meta.get("sharded", []):
            spec = m.get("spec") or {}
            layers.append({"layer": m["name"], "rows": m["size"], "hot": m["size"], "cold": 0,
                           "capacity": m["capacity_per_shard"], "d_in": m["d_in"], "d_out": m["d_out"],
                           "bytes": m["bytes"], "kernel": spec.get("kernel") if isinstance(spec, dict) else None,
                           "temperature": spec.get("temperature") if isinstance(spec, dict) else None,
                           "shards": list(m["host_sizes"]), "placement": m["placement"],
                           "next_shard": m["next_shard"]})
        return {"directory": ck.directory, "step": meta["step"], "steps": ck.all_steps(),
                "created_at": meta["created_at"], "format_version": meta["format_version"],
                "growmem_version": meta.get("growmem_version"), "policy": meta.get("policy"),
                "data_position": meta.get("data_position"), "bytes": meta.get("bytes"),
                "params": sum(int(np.prod(e["shape"])) for e in meta["leaves"] if e["path"].startswith("params")),
                "layers": layers}
    finally:
        ck.close()


def format_inspect(info: dict) -> str:
    """The text ``growmem inspect`` prints."""
    lines = [f"checkpoint   {info['directory']}",
             f"step         {info['step']}   (kept: {info['steps']})",
             f"created at   {info['created_at']}",
             f"format       version {info['format_version']} (growmem {info['growmem_version']})",
             f"policy       {json.dumps(info['policy']) if info['policy'] is not None else '-'}",
             f"data order   {json.dumps(info['data_position']) if info['data_position'] is not None else '-'}",
             f"params       {info['params']} parametric values",
             f"bytes        {info['bytes']}",
             "",
             f"{'layer':<16}{'rows':>10}{'hot':>10}{'cold':>10}{'bytes':>14}  kernel (T)"]
    for l in info["layers"]:
        t = "" if l["temperature"] is None else f" (T={l['temperature']})"
        lines.append(f"{l['layer']:<16}{l['rows']:>10}{l['hot']:>10}{l['cold']:>10}{l['bytes']:>14}  "
                     f"{l['kernel']}{t}")
        if l.get("shards") is not None:
            sh = l["shards"]
            shown = ", ".join(map(str, sh if len(sh) <= 16 else sh[:8])) + ("" if len(sh) <= 16 else ", ...")
            lines.append(f"{'':<16}{len(sh)} shards × capacity {l['capacity']} ({l['placement']}), rows per shard: "
                         f"[{shown}]")
    return "\n".join(lines)


def export(directory, npz_path, step: Optional[int] = None) -> dict:
    """Write the rows of every layer as plain numpy arrays to ``npz_path``.

    Arrays are named ``<layer>/w``, ``<layer>/k``, ``<layer>/v``, ``<layer>/born`` (all
    rows: cold rows first, then hot rows, for tiered memories; shard 0's rows first, then
    shard 1's..., for sharded memories, whose rows per shard are in the description —
    this gathers every shard into this process, so it refuses to run in a multi-process
    ``jax.distributed`` run). The npz also holds
    ``__description__``, a JSON string with kernels, temperatures, rules, shapes and the
    step; the same JSON is written next to it as ``<npz>.json``. Returns the description.
    """
    ck = _open(directory)
    try:
        step = ck._pick(step)
        meta = ck.read_meta(step)
        if meta.get("sharded") and jax.process_count() > 1:
            raise CheckpointError(f"export gathers the rows of the sharded layers "
                                  f"{[m['name'] for m in meta['sharded']]} into one process; run it in a single "
                                  f"process (this is process {jax.process_index()} of {jax.process_count()})")
        host = ck._ocp.RestoreArgs(restore_type=np.ndarray)
        arrays = ck._read_arrays(step, meta, {k: host for m in meta.get("sharded", []) for k in m["arrays"].values()})
        where = f"checkpoint step {step} in {ck.directory}"
        _verify(arrays, meta, where=where)
        sharded_rows = {m["name"]: _host_rows(m, arrays, True, where) for m in meta.get("sharded", [])}
    finally:
        ck.close()
    out, layers = {}, {}
    for m in meta["memories"]:
        name = m["name"]
        for f in MEMORY_FIELDS:
            dt = np.int32 if f == "born" else np.dtype(m["dtype"])
            shape = {"w": (0,), "born": (0,), "k": (0, m["d_in"]), "v": (0, m["d_out"])}[f]
            out[f"{name}/{f}"] = arrays[m["arrays"][f]] if f in m["arrays"] else np.zeros(shape, dt)
        spec = m.get("spec") or {}
        layers[name] = {"rows": m["size"], "d_in": m["d_in"], "d_out": m["d_out"], "t": m["t"], "spec": spec,
                        "kernel": spec.get("kernel") if isinstance(spec, dict) else None,
                        "temperature": spec.get("temperature") if isinstance(spec, dict) else None,
                        "momentum": spec.get("momentum") if isinstance(spec, dict) else None}
    if meta["tiers"]:
        from .tiered import TieredMemory

        for t in meta["tiers"]:
            hot = {f: arrays[k] for f, k in t["arrays"].items()}
            spec = t.get("spec")
            if isinstance(spec, dict) and spec.get("policy") is not None:
                # reading rows needs no policy (it cannot be rebuilt from its name anyway)
                from .tiered import _spec_from_dict

                spec = _spec_from_dict({**spec, "policy": None})
            else:
                spec = None
            tier = TieredMemory.from_checkpoint(hot, t, read_only=True, spec=spec)
            rows = tier.all_rows()
            if "spill" in t and f"{t['name']}/w" in out:
                # a trainer's layer whose oldest rows spilled: cold rows (with the weight decay they
                # missed since they spilled) first, then the hot rows of the memory
                from .spill import aged

                spec = t.get("spec") or {}
                pol = spec.get("policy") if isinstance(spec, dict) else None
                retention = float(pol.get("retention", 1.0)) if isinstance(pol, dict) else 1.0
                rows = aged(rows, 0, t["spill"]["seg_start"], t["spill"]["seg_t"], int(layers[t["name"]]["t"]),
                            retention, spec.get("kernel") == "weighted_softmax")
                for f, a in rows.items():
                    out[f"{t['name']}/{f}"] = np.concatenate([a, out[f"{t['name']}/{f}"]])
                layers[t["name"]]["rows"] += t["rows_cold"]
                layers[t["name"]]["rows_cold"] = t["rows_cold"]
                continue
            for f, a in rows.items():
                out[f"{t['name']}/{f}"] = a
            layers[t["name"]] = {"rows": t["rows_hot"] + t["rows_cold"], "d_in": t["d_in"], "d_out": t["d_out"],
                                 "t": t.get("t"), "kernel": t.get("kernel"), "temperature": t.get("temperature"),
                                 "momentum": t.get("momentum"), "spec": t.get("spec")}
    for m in meta.get("sharded", []):
        for f, a in sharded_rows[m["name"]].items():
            out[f"{m['name']}/{f}"] = a
        spec = m.get("spec") or {}
        layers[m["name"]] = {"rows": m["size"], "d_in": m["d_in"], "d_out": m["d_out"], "t": m["t"], "spec": spec,
                             "kernel": spec.get("kernel") if isinstance(spec, dict) else None,
                             "temperature": spec.get("temperature") if isinstance(spec, dict) else None,
                             "momentum": spec.get("momentum") if isinstance(spec, dict) else None,
                             "shards": list(m["host_sizes"]), "placement": m["placement"]}
    desc = {"format": "growmem-export", "source": os.path.abspath(os.fspath(directory)), "step": meta["step"],
            "created_at": meta["created_at"], "format_version": meta["format_version"],
            "value_convention": "v holds ṽ = w·v for the weighted_softmax kernel (Eq. 8), v otherwise",
            "born_convention": "creation step of each row; -1 for initial rows",
            "layers": layers, "policy": meta.get("policy")}
    npz_path = os.fspath(npz_path)
    np.savez(npz_path, __description__=np.asarray(json.dumps(desc)), **out)
    real = npz_path if npz_path.endswith(".npz") else npz_path + ".npz"
    Path(real + ".json").write_text(json.dumps(desc, indent=2))
    return desc
