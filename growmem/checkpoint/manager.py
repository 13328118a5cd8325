"""Orbax checkpoints of a trainer's state and of stand-alone memories.

A checkpoint (one step) holds:

* ``meta`` — a JSON description: format version, step, created-at, every leaf of the state
  (path, shape, dtype, CRC32), every memory (layer name, rows, clock, capacity, spec, policy,
  and what its backend said about it), the RNG key, the data-order position, the user's
  config, policy description and extra JSON;
* ``host`` — the arrays every process holds whole (parameters, optimizer and policy state,
  the rows in use of in-RAM memories), one raw ``.npy`` file each, written by process 0;
* ``global`` — arrays sharded over devices (the row arrays of sharded memories and their
  per-row policy state), through Orbax's standard PyTree handler: each process writes, and on
  restore reads, only the shards on its own devices (a CRC32 per shard).

A memory is saved by its backend (:meth:`growmem.backends.RAM.save`): in RAM, its rows in
use; sharded, its global row arrays and rows per shard; tiered, its hot rows and the disk
tier *by reference* (URL, generation, row count), so a checkpoint never points at rows
written after it. Steps are written through ``orbax.checkpoint.CheckpointManager``: into a
temporary folder renamed when complete (a run killed mid-save keeps its previous checkpoint;
a save that fails removes its temporary folder); the last ``keep`` steps are kept.
"""
from __future__ import annotations

import dataclasses
import datetime
import io
import json
import os
import re
import shutil
import zlib
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from .. import backends, locks
from ..version import __version__
from .. import memory as memlib
from ..backends.sharded import host_value
from ..runtime import allgather_json
from ..errors import CheckpointError, ConfigError, ConfigMismatchError, CorruptCheckpointError, IncompatibleVersionError
from ..layers import GrowingSpec
from ..store import Store

FORMAT_NAME = "growmem-checkpoint"
#: bump when the on-disk layout changes incompatibly (3: host arrays as .npy, backends' items)
FORMAT_VERSION = 3
READABLE_VERSIONS = (FORMAT_VERSION,)
META_ITEM, HOST_ITEM, GLOBAL_ITEM = "meta", "host", "global"




class Restored(NamedTuple):
    """What :meth:`Checkpointer.restore` returns besides the state it installs."""

    step: int
    state: Any             # the restored TrainState (also installed into the trainer)
    rng: Any               # the saved PRNG key (or None)
    data_position: Any     # whatever JSON the caller saved
    config: Any            # the saved user config (JSON)
    policy: Any            # the saved policy description (JSON)
    extra: Any             # the saved extra JSON
    meta: dict             # the full JSON description
    stores: Dict[str, Any] = {}   # name -> restored growmem.store.Store


# ----------------------------------------------------------------------------- helpers

def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_str(path) -> str:
    """``('params', 'Dense_0', 'kernel')``-like key path as ``params/Dense_0/kernel``."""
    return "/".join(_key_name(k) for k in path)


def crc32(a: np.ndarray) -> int:
    return zlib.crc32(np.require(a, requirements="C").reshape(-1).view(np.uint8)) & 0xFFFFFFFF


_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


def _jsonish(x):
    """A JSON value for a spec field: dataclasses field by field, functions by name."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
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


def spec_from_json(d, where: str = "checkpoint"):
    """Rebuild a :class:`growmem.GrowingSpec` from :func:`spec_to_json`."""
    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: no layer spec saved; pass it explicitly")
    names = {f.name for f in dataclasses.fields(GrowingSpec)}
    kw = {k: v for k, v in d.items() if k in names}
    kw["hyper"] = tuple(tuple(p) for p in kw.get("hyper", ()))
    try:
        return GrowingSpec(**kw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: the saved layer spec {d} cannot be rebuilt ({e}); pass it explicitly") from e


def diff(a, b, prefix="") -> List[str]:
    """Human-readable differences between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{prefix}{k}: missing in checkpoint, current {b[k]!r}")
            elif k not in b:
                out.append(f"{prefix}{k}: checkpoint {a[k]!r}, missing now")
            else:
                out += diff(a[k], b[k], f"{prefix}{k}.")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{prefix}{i}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: checkpoint {a!r}, current {b!r}"]


def _is_trainer(obj) -> bool:
    return hasattr(obj, "state") and callable(getattr(obj, "step", None))


def _state_of(obj):
    return obj.state if _is_trainer(obj) else obj


def _flatten(state):
    return jax.tree_util.tree_flatten_with_path(state, is_leaf=memlib.is_memory)


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _is_global(x) -> bool:
    """An array split over devices (its sharding partitions an axis, even over a one-device
    mesh): saved shard by shard, each by the process that holds it."""
    if not isinstance(x, jax.Array) or _is_key(x):
        return False
    sh = x.sharding
    if isinstance(sh, jax.sharding.NamedSharding):
        return any(p is not None for p in sh.spec)
    return not sh.is_fully_replicated


def _host(x):
    """``(numpy array, key impl or None)`` of a whole (replicated or single-device) leaf."""
    if _is_key(x):
        return _host(jax.random.key_data(x))[0], str(jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0)), None
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


def _local_crcs(a: jax.Array) -> Dict[str, int]:
    """CRC32 of each shard of a global array held by this process, keyed by its first row."""
    return {str(piece.index[0].start or 0): crc32(np.asarray(piece.data)) for piece in a.addressable_shards
            if piece.replica_id == 0}


def _gather_json(local: dict) -> dict:
    """Merge small dicts from every process (collective: :func:`growmem.runtime.allgather_json`)."""
    if jax.process_count() == 1:
        return local
    out = {}
    for theirs in allgather_json(local):
        for k, v in theirs.items():
            out.setdefault(k, {}).update(v) if isinstance(v, dict) else out.__setitem__(k, v)
    return out


def _memory_entry(name: str, path: str, mem, be, bmeta: dict) -> dict:
    rows, hot = be.rows_in_use(mem), be.hot_rows(mem)
    return {"name": name, "path": path, "size": rows, "rows_hot": hot, "rows_cold": rows - hot,
            "t": int(host_value(mem.t)), "capacity": mem.capacity, "d_in": mem.d_in,
            "d_out": mem.d_out, "dtype": str(mem.k.dtype), "spec": spec_to_json(mem.spec),
            "policy": None if mem.policy is None else {"name": mem.policy.name, "retention": mem.policy.retention},
            "bytes": rows * mem.row_bytes, "backend": bmeta, "arrays": {}, "crc32": {}}


# ----------------------------------------------------------------------------- the host-array handler

def _fsync(f) -> None:
    """Flush a written file to the disk (local files; remote paths have no descriptor)."""
    try:
        f.flush()
        os.fsync(f.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass


def _handlers():
    """Orbax handler for the host arrays: one raw ``.npy`` per array (no chunking, no
    compression: rows barely compress), written by the primary process."""
    import orbax.checkpoint as ocp
    from orbax.checkpoint import args as ocp_args

    class HostArraysHandler(ocp.CheckpointHandler):
        def save(self, directory, args):
            if jax.process_index() != 0:
                return
            directory = epath.Path(directory)
            for name, a in args.arrays.items():
                with (directory / f"{name}.npy").open("wb") as f:
                    np.save(f, np.require(a, requirements="C"), allow_pickle=False)
                    _fsync(f)          # durable before Orbax renames the step into place

        def restore(self, directory, args):
            directory = epath.Path(directory)
            out = {}
            for name in args.names:
                p = directory / f"{name}.npy"
                try:
                    with p.open("rb") as f:
                        out[name] = np.load(f, allow_pickle=False)
                except FileNotFoundError:
                    raise CorruptCheckpointError(f"{p} is missing") from None
                except (ValueError, OSError, EOFError) as e:
                    raise CorruptCheckpointError(f"{p} is missing or truncated, or corrupt ({e})") from None
            return out

    @ocp_args.register_with_handler(HostArraysHandler, for_save=True)
    @dataclasses.dataclass
    class HostSave(ocp_args.CheckpointArgs):
        arrays: Dict[str, np.ndarray]

    @ocp_args.register_with_handler(HostArraysHandler, for_restore=True)
    @dataclasses.dataclass
    class HostRestore(ocp_args.CheckpointArgs):
        names: List[str]

    return HostArraysHandler, HostSave, HostRestore


_HANDLERS = None


def handlers():
    global _HANDLERS
    if _HANDLERS is None:
        _HANDLERS = _handlers()
    return _HANDLERS


_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


def _disk_full(e: BaseException, directory: str) -> bool:
    """Whether a failed save ran out of disk: ENOSPC, TensorStore's RESOURCE_EXHAUSTED, or a write
    that stopped short (numpy's ``N requested and M written``) where the disk has less room left
    than the write asked for."""
    text = str(e)
    if getattr(e, "errno", None) == 28 or "No space left" in text or "RESOURCE_EXHAUSTED" in text:
        return True
    short = _SHORT_WRITE.search(text)
    if short is None or "://" in directory:
        return False
    try:
        return shutil.disk_usage(directory).free < int(short.group(1))
    except OSError:
        return False


def _checkpoints_below(directory, depth: int = 3) -> list:
    """The folders up to ``depth`` levels below a local ``directory`` that hold a checkpoint step (a
    ``growmem continual`` run keeps them in METHOD/seedN/ckpt), sorted."""
    if "://" in str(directory) or not os.path.isdir(directory):
        return []
    found, level = [], [str(directory)]
    for _ in range(depth):
        below = []
        for d in level:
            try:
                subs = sorted(e.path for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))
            except OSError:
                continue
            for sub in subs:
                try:
                    steps = [e for e in os.listdir(sub) if e.isdigit()]
                except OSError:
                    continue
                if any(os.path.isfile(os.path.join(sub, e, META_ITEM, "metadata")) for e in steps):
                    found.append(sub)
                else:
                    below.append(sub)
        level = below
    return sorted(found)


def _location(directory) -> str:
    """A local absolute path for paths and ``file://`` URLs; other URLs (``gs://``) as given."""
    d = os.fspath(directory)
    if d.startswith("file://"):
        d = d[len("file://"):]
    if "://" not in d:
        d = os.path.abspath(d)
    return d


# ----------------------------------------------------------------------------- the manager

def _read_meta(directory: str, step: int) -> dict:
    """The JSON description of checkpoint ``step`` in ``directory``, after the version check."""
    path = epath.Path(directory) / str(step) / META_ITEM / "metadata"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptCheckpointError(f"checkpoint step {step} in {directory} has no {META_ITEM}/metadata "
                                     f"file: not a growmem checkpoint, or it is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"{path} is truncated or corrupt: {e}") from None
    check_version(meta, where=str(path))
    return meta


def latest_meta(directory) -> Optional[dict]:
    """The description of the newest complete checkpoint in ``directory`` (None without one), read without
    opening a manager: no lock, no Orbax metadata, no collective — for a look before a run starts."""
    import orbax.checkpoint as ocp

    directory = _location(directory)
    steps = ocp.utils.checkpoint_steps(directory) if epath.Path(directory).is_dir() else []
    return _read_meta(directory, max(steps)) if steps else None


class Checkpointer:
    """Keep the last ``keep`` checkpoints of a run in ``directory`` (created if needed).

    ``directory``: a path, a ``file://`` URL, or any URL Orbax's paths accept (``gs://``).
    """

    def __init__(self, directory, keep: Optional[int] = 3, *, create: bool = True):
        import orbax.checkpoint as ocp

        if keep is not None and keep < 1:
            raise ConfigError(f"keep must be >= 1, got {keep}")
        self.directory = _location(directory)
        local = "://" not in self.directory
        if local:
            if create:
                try:
                    os.makedirs(self.directory, exist_ok=True)
                except OSError as e:
                    raise CheckpointError(f"cannot create checkpoint directory {self.directory}: "
                                          f"{e.strerror or e}") from None
                if not os.access(self.directory, os.W_OK):
                    raise CheckpointError(f"checkpoint directory {self.directory} is not writable")
            elif not os.path.isdir(self.directory):
                raise CheckpointError(f"no checkpoint directory at {self.directory}")
        self._lock = None
        if local and create and jax.process_index() == 0:
            # one writer per folder: a second run saving here would interleave steps with this one
            try:
                self._lock = locks.acquire(self.directory, "checkpoint directory")
            except locks.LockedError as e:
                raise CheckpointError(str(e)) from None
        self._ocp = ocp
        handler, self._HostSave, self._HostRestore = handlers()
        opts = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False, create=create)
        item_handlers = {META_ITEM: ocp.JsonCheckpointHandler(), HOST_ITEM: handler(),
                         GLOBAL_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False)}
        self._mgr = ocp.CheckpointManager(self.directory, options=opts, item_handlers=item_handlers)

    # -- queries
    def all_steps(self) -> List[int]:
        self._mgr.reload()
        return sorted(int(s) for s in self._mgr.all_steps())

    def delete(self, step: int):
        """Remove one checkpoint step."""
        self._mgr.delete(int(step))

    def latest_step(self) -> Optional[int]:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def close(self):
        self._mgr.close()
        if self._lock is not None:
            locks.release(self._lock)
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def step_dir(self, step: int) -> epath.Path:
        return epath.Path(self.directory) / str(step)

    # -- save
    def save(self, trainer, step: Optional[int] = None, *, rng=None, data_position=None, config=None,
             policy=None, extra=None, stores: Optional[Mapping[str, Any]] = None) -> int:
        """Write one checkpoint; returns its step.

        ``trainer``: a :class:`growmem.Trainer`, a ``TrainState``, or None (then pass ``step``).
        ``rng``: a PRNG key. ``data_position``, ``config``, ``policy``, ``extra``: JSON values
        (the data-order position, the configuration :meth:`restore` checks, a policy
        description, anything else). ``stores``: ``{name: growmem.store.Store}`` memories
        outside the trainer. In a multi-process run every process calls ``save`` alike.
        """
        if trainer is None:
            if step is None:
                raise ConfigError("save(None, ...) needs an explicit step")
            state = {}
        else:
            state = _state_of(trainer)
        step = int(host_value(state.step)) if step is None else int(step)
        latest = self.latest_step()
        if latest is not None and step <= latest:  # orbax would skip it silently
            raise CheckpointError(f"cannot save step {step}: {self.directory} already holds step {latest}; "
                                  f"resume from it, or use another directory")
        host: Dict[str, np.ndarray] = {}
        glob: Dict[str, jax.Array] = {}
        leaves, memories, shard_crcs = [], [], {}

        def put(key, a, entry, field=None):
            if isinstance(a, jax.Array) and _is_global(a):
                glob[key] = a
                shard_crcs[key] = _local_crcs(a)
                slot = {"global": key, "shape": list(a.shape), "dtype": str(a.dtype)}
            else:
                a = np.asarray(a)
                host[key] = a
                slot = {"host": key, "shape": list(a.shape), "dtype": str(a.dtype), "crc32": crc32(a)}
            if field is None:
                entry.update(slot)
            else:
                entry["arrays"][field] = slot

        flat, _ = _flatten(state)
        for i, (path, leaf) in enumerate(flat):
            p = path_str(path)
            if memlib.is_memory(leaf):
                name = _layer_name(path)
                be = backends.of(leaf)
                arrays, bmeta = be.save(name, leaf)
                entry = _memory_entry(name, p, leaf, be, bmeta)
                for f, a in arrays.items():
                    put(f"mem{i:04d}_{_safe(name)}_{f}", a, entry, f)
                memories.append(entry)
                continue
            if isinstance(leaf, jax.Array) and _is_global(leaf):
                entry = {"path": p, "key_impl": None}
                put(f"leaf{i:05d}", leaf, entry)
            else:
                a, impl = _host(leaf) if not isinstance(leaf, (int, float)) else (np.asarray(leaf), None)
                entry = {"path": p, "key_impl": impl}
                put(f"leaf{i:05d}", a, entry)
            leaves.append(entry)
        store_meta = []
        for name, st in (stores or {}).items():
            arrays, bmeta = st.backend.save(name, st.mem)
            entry = _memory_entry(name, f"stores/{name}", st.mem, st.backend, bmeta)
            for f, a in arrays.items():
                put(f"store_{_safe(name)}_{f}", a, entry, f)
            store_meta.append(entry)
        rng_meta = None
        if rng is not None:
            a, impl = _host(rng)
            host["rng"] = a
            rng_meta = {"host": "rng", "key_impl": impl, "shape": list(a.shape), "dtype": str(a.dtype),
                        "crc32": crc32(a)}
        shard_crcs = _gather_json(shard_crcs)
        meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "growmem_version": __version__,
                "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "directory": self.directory,   # where it was written: a copy finds its own cold tiers by it
                "step": step, "leaves": leaves, "memories": memories, "stores": store_meta, "rng": rng_meta,
                "shard_crc32": shard_crcs, "data_position": data_position, "config": config, "policy": policy,
                "extra": extra, "process_count": jax.process_count(),
                "bytes": int(sum(a.nbytes for a in host.values()) + sum(a.nbytes for a in glob.values()))}
        try:
            json.dumps(meta)
        except TypeError as e:
            raise CheckpointError(f"data_position, config, policy and extra must be JSON-serialisable: {e}") from e
        ocp = self._ocp
        items = {META_ITEM: ocp.args.JsonSave(meta), HOST_ITEM: self._HostSave(host)}
        if glob:
            items[GLOBAL_ITEM] = ocp.args.PyTreeSave(glob)
        before = set(self._entries())
        try:
            self._mgr.save(step, args=ocp.args.Composite(**items), force=True)
            self._mgr.wait_until_finished()
        except BaseException as e:
            full = _disk_full(e, self.directory)      # before the partial step is removed and frees its room
            self._remove_partial(before)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            reason = "the disk is full" if full else f"{type(e).__name__}: {e}"
            last = self.latest_step()
            raise CheckpointError(f"saving step {step} to {self.directory} failed ({reason}); nothing was written; "
                                  f"the last good checkpoint is "
                                  f"{'step ' + str(last) if last is not None else 'none'}") from None
        return step

    def _entries(self):
        if "://" in self.directory or not os.path.isdir(self.directory):
            return []
        return [n for n in os.listdir(self.directory) if n != locks.LOCK_NAME]

    def _remove_partial(self, before):
        """Remove what a failed save left (Orbax's temporary folder), never a complete step."""
        if "://" in self.directory or jax.process_index() != 0:
            return
        steps = {str(s) for s in self.all_steps()}
        for name in set(self._entries()) - set(before) - steps:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    # -- restore
    def read_meta(self, step: Optional[int] = None) -> dict:
        """The JSON description of a checkpoint (latest by default), after the version check."""
        return _read_meta(self.directory, self._pick(step))

    def _pick(self, step):
        steps = self.all_steps()
        if not steps:
            inner = _checkpoints_below(self.directory)
            hint = "" if not inner else (
                f"; it holds run folders whose checkpoints are in {', '.join(inner[:3])}"
                + (f" and {len(inner) - 3} more" if len(inner) > 3 else "") + ": name one of them")
            raise CheckpointError(f"no complete checkpoint in {self.directory}{hint}")
        if step is None:
            return steps[-1]
        if int(step) not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; have {steps}")
        return int(step)

    def read_arrays(self, step: int, meta: dict, global_args: Optional[Mapping[str, Any]] = None,
                    verify: bool = True) -> Dict[str, Any]:
        """The host arrays of ``meta`` (numpy), plus the global arrays named in ``global_args``
        (``{name: orbax restore args}``), each checked against its CRC32 when ``verify``."""
        where = f"checkpoint step {step} in {self.directory}"
        slots = _slots(meta)
        names = [s["host"] for s in slots if "host" in s]
        out: Dict[str, Any] = {}
        ocp = self._ocp
        items = {}
        if names:
            items[HOST_ITEM] = self._HostRestore(names)
        global_args = dict(global_args or {})
        if global_args:
            n_saved = sum(1 for s in slots if "global" in s)
            items[GLOBAL_ITEM] = ocp.args.PyTreeRestore(item={n: 0 for n in global_args}, restore_args=global_args,
                                                        partial_restore=len(global_args) < n_saved)
        if not items:
            return out
        try:
            got = self._mgr.restore(step, args=ocp.args.Composite(**items))
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{where}: {e}") from None
        except Exception as e:  # orbax/tensorstore raise many types for damaged files
            raise CorruptCheckpointError(f"{where} cannot be read — a file is missing or truncated: "
                                         f"{type(e).__name__}: {e}") from None
        if names:
            out.update(got[HOST_ITEM])
            for s in slots:     # .npy has no bfloat16: such arrays come back as raw 2-byte voids
                a = out.get(s.get("host"))
                if a is not None and a.dtype.kind == "V" and "dtype" in s:
                    want = jnp.dtype(s["dtype"])
                    if want.itemsize == a.dtype.itemsize:
                        out[s["host"]] = a.view(want)
        if global_args:
            out.update(dict(got[GLOBAL_ITEM]))
        if verify:
            verify_arrays(out, meta, where)
        return out

    def verify(self, step: Optional[int] = None) -> int:
        """Read every array of a checkpoint and check its CRC32s (``CorruptCheckpointError``);
        returns the step. Sharded arrays are read to the host (single process)."""
        step = self._pick(step)
        meta = self.read_meta(step)
        host = self._ocp.RestoreArgs(restore_type=np.ndarray)
        self.read_arrays(step, meta, {s["global"]: host for s in _slots(meta) if "global" in s})
        return step

    def restore_leaves(self, step: Optional[int] = None, *, config=None) -> Restored:
        """A checkpoint of host arrays of any shapes (``save({path: array, ...})``: a model with no template to
        restore into) read back by path: ``Restored.state`` is ``{path: numpy array}``, given only after
        ``config`` matched the saved one (:class:`ConfigMismatchError`) and every checksum did."""
        step = self._pick(step)
        meta = self.read_meta(step)
        if config is not None and meta.get("config") is not None:
            diffs = diff(meta["config"], json.loads(json.dumps(config, default=repr)))
            if diffs:
                raise ConfigMismatchError(f"checkpoint step {step} in {self.directory} was written with a different "
                                          f"config: " + "; ".join(diffs))
        arrays = self.read_arrays(step, meta)
        state = {entry["path"]: arrays[entry["host"]] for entry in meta["leaves"]}
        return Restored(step=step, state=state, rng=None, data_position=meta.get("data_position"),
                        config=meta.get("config"), policy=meta.get("policy"), extra=meta.get("extra"), meta=meta,
                        stores={})

    def restore(self, trainer=None, step: Optional[int] = None, *, config=None,
                stores: Optional[Mapping[str, Any]] = None, verify: bool = True) -> Restored:
        """Restore a checkpoint (latest by default) into ``trainer``.

        ``trainer`` (a :class:`growmem.Trainer`, or a ``TrainState`` used as a template) must be
        built from the same model configuration and backends: another set of variables, a
        shape, a dtype, or a layer's spec raise :class:`ConfigMismatchError` naming what
        differs. ``config`` is compared with the saved config the same way. With a Trainer the
        state is installed into it. ``stores``: ``{name: backend or template Store}`` — each
        saved stand-alone memory is restored onto that backend (a mesh of another shard
        count re-distributes the rows, single process). In a multi-process run every process
        calls ``restore`` alike.
        """
        step = self._pick(step)
        meta = self.read_meta(step)
        where = f"checkpoint step {step} in {self.directory}"
        if config is not None and meta.get("config") is not None:
            diffs = diff(meta["config"], json.loads(json.dumps(config, default=repr)))
            if diffs:
                raise ConfigMismatchError(f"{where} was written with a different config: " + "; ".join(diffs))
        template = _state_of(trainer) if trainer is not None else None
        plan = _plan(template, meta, stores or {}, where)
        arrays = self.read_arrays(step, meta, plan.global_args, verify=False)
        # the checksums are computed while the state is rebuilt (zlib releases the GIL); nothing is
        # installed or returned before they all match
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=1) as pool:
            checked = pool.submit(verify_arrays, arrays, meta, where) if verify else None
            state = plan.rebuild(arrays) if template is not None else None
            if checked is not None:
                checked.result()
        if state is not None and _is_trainer(trainer):
            trainer.set_state(state) if hasattr(trainer, "set_state") else setattr(trainer, "state", state)
        restored_stores = {name: Store(plan.restore_memory(entry, tmpl, arrays), name)
                           for name, (entry, tmpl) in plan.stores.items()}
        rng = None
        if meta.get("rng"):
            r = meta["rng"]
            a = arrays[r["host"]]
            rng = jax.random.wrap_key_data(a, impl=r["key_impl"]) if r.get("key_impl") else jnp.asarray(a)
        return Restored(step=step, state=state, rng=rng, data_position=meta.get("data_position"),
                        config=meta.get("config"), policy=meta.get("policy"), extra=meta.get("extra"), meta=meta,
                        stores=restored_stores)


def check_version(meta: dict, where: str = "checkpoint"):
    fmt, ver = meta.get("format"), meta.get("format_version")
    if fmt != FORMAT_NAME:
        raise IncompatibleVersionError(f"{where}: not a growmem checkpoint (format {fmt!r})")
    if ver not in READABLE_VERSIONS:
        raise IncompatibleVersionError(f"{where}: checkpoint format version {ver} is incompatible with this "
                                       f"growmem (reads format version {' or '.join(map(str, READABLE_VERSIONS))}); "
                                       f"use the growmem version that wrote it")


def _slots(meta) -> List[dict]:
    """Every array slot of a description (leaves, memory fields, stores, rng)."""
    out = [e for e in meta["leaves"] if "host" in e or "global" in e]
    for m in meta["memories"] + meta.get("stores", []):
        out += list(m["arrays"].values())
    if meta.get("rng"):
        out.append(meta["rng"])
    return out


def verify_arrays(arrays, meta, where):
    crcs = meta.get("shard_crc32", {})
    for s in _slots(meta):
        if "host" in s and s["host"] in arrays:
            if crc32(arrays[s["host"]]) != s["crc32"]:
                raise CorruptCheckpointError(f"{where}: array {s['host']} does not match its checksum "
                                             f"(file truncated or corrupt)")
        elif "global" in s and s["global"] in arrays:
            a, saved = arrays[s["global"]], crcs.get(s["global"], {})
            if isinstance(a, jax.Array):
                got = _local_crcs(a)
            else:  # read to the host whole: check it block by block as it was saved
                got = {}
                starts = sorted(int(k) for k in saved)
                for j, lo in enumerate(starts):
                    hi = starts[j + 1] if j + 1 < len(starts) else len(a)
                    got[str(lo)] = crc32(np.asarray(a)[lo:hi])
            for k, c in got.items():
                if k in saved and saved[k] != c:
                    raise CorruptCheckpointError(f"{where}: array {s['global']} (shard at row {k}) does not match "
                                                 f"its checksum (file truncated or corrupt)")


class _Plan:
    """What a restore reads (global arrays onto which devices) and how it rebuilds the state."""

    def __init__(self):
        self.global_args: Dict[str, Any] = {}
        self.rebuild = None
        self.stores: Dict[str, tuple] = {}
        self.restore_memory = None


def _global_args_for(entry, be, template_mem):
    """Orbax restore args for a memory's global arrays: onto the template backend's devices, or
    to the host when the shard count differs."""
    import orbax.checkpoint as ocp

    onto = be.restore_args(dict(entry["backend"], name=entry["name"]), template_mem) \
        if hasattr(be, "restore_args") else None
    out = {}
    for f, slot in entry["arrays"].items():
        if "global" in slot:
            out[slot["global"]] = onto[f] if onto is not None else ocp.RestoreArgs(restore_type=np.ndarray)
    return out


def _plan(template, meta, stores, where) -> _Plan:
    import orbax.checkpoint as ocp

    plan = _Plan()
    problems = []

    def check_memory(entry, mem, label):
        d = diff(entry["spec"], spec_to_json(mem.spec))
        if (entry["d_in"], entry["d_out"]) != (mem.d_in, mem.d_out):
            d.append(f"(d_in, d_out): checkpoint {(entry['d_in'], entry['d_out'])}, current {(mem.d_in, mem.d_out)}")
        if entry["dtype"] != str(mem.k.dtype):
            d.append(f"row dtype: checkpoint {entry['dtype']}, current {mem.k.dtype}")
        saved_be, cur_be = entry["backend"]["backend"], backends.of(mem).name
        if saved_be != cur_be:
            d.append(f"backend: checkpoint {saved_be}, current {cur_be}" + (
                " (the run spilled rows to disk: build the trainer with its Tiered backend, resume=True)"
                if saved_be == "tiered" else ""))
        if d:
            problems.append(f"{label}: " + "; ".join(d))
            return False
        return True

    def restore_memory(entry, mem, arrays):
        be = backends.of(mem)
        rows = {f: arrays[slot.get("host") or slot.get("global")] for f, slot in entry["arrays"].items()}
        bmeta = dict(entry["backend"], size=entry["rows_hot"], t=entry["t"], capacity=entry["capacity"])
        return be.restore(entry["name"], bmeta, rows, mem)

    plan.restore_memory = restore_memory

    if template is not None:
        flat, treedef = _flatten(template)
        saved_leaves = {e["path"]: e for e in meta["leaves"]}
        saved_mems = {m["path"]: m for m in meta["memories"]}
        cur = {path_str(p) for p, _ in flat}
        missing = sorted((set(saved_leaves) | set(saved_mems)) - cur)
        extra = sorted(cur - set(saved_leaves) - set(saved_mems))
        if missing:
            problems.append(f"variables in the checkpoint but not in the model: {missing}")
        if extra:
            problems.append(f"variables in the model but not in the checkpoint: {extra}")
        # per-row leaves outside the memories (a policy's row state) follow the memory's capacity
        caps = {}
        for path, leaf in flat:
            m = saved_mems.get(path_str(path))
            if memlib.is_memory(leaf) and m is not None:
                backends.of(leaf).check_restore(m["backend"], m["name"])
                caps.setdefault(leaf.capacity, set()).add(m["capacity"])
                if check_memory(m, leaf, f"layer {m['name']}"):
                    plan.global_args.update(_global_args_for(m, backends.of(leaf), leaf))
        for path, leaf in flat:
            e = saved_leaves.get(path_str(path))
            if e is None or memlib.is_memory(leaf):
                continue
            cur_a = leaf if isinstance(leaf, (jax.Array, np.ndarray)) else np.asarray(leaf)
            shape = tuple(jax.random.key_data(cur_a).shape) if _is_key(cur_a) else tuple(cur_a.shape)
            dtype = str(jax.random.key_data(cur_a).dtype) if _is_key(cur_a) else str(cur_a.dtype)
            row_leaf = (len(shape) >= 1 and len(e["shape"]) == len(shape) and list(shape[1:]) == e["shape"][1:]
                        and e["shape"][0] in caps.get(shape[0], ()))
            if (list(shape) != e["shape"] and not row_leaf) or dtype != e["dtype"]:
                problems.append(f"{path_str(path)}: checkpoint {e['dtype']}{tuple(e['shape'])}, current "
                                f"{dtype}{shape}")
                continue
            if "global" in e:
                plan.global_args[e["global"]] = ocp.ArrayRestoreArgs(sharding=leaf.sharding,
                                                                     global_shape=tuple(e["shape"]))

        def rebuild(arrays):
            out = []
            for path, leaf in flat:
                p = path_str(path)
                if memlib.is_memory(leaf):
                    m = saved_mems.get(p)
                    out.append(leaf if m is None else restore_memory(m, leaf, arrays))
                    continue
                e = saved_leaves.get(p)
                if e is None:
                    out.append(leaf)
                    continue
                if "global" in e:
                    out.append(arrays[e["global"]])
                    continue
                a = arrays[e["host"]] if "host" in e else np.zeros(e["shape"], e["dtype"])
                if e.get("key_impl"):
                    out.append(jax.random.wrap_key_data(jnp.asarray(a), impl=e["key_impl"]))
                elif isinstance(leaf, np.ndarray):
                    out.append(np.array(a))
                elif isinstance(leaf, (int, float)):
                    out.append(type(leaf)(a.item()))
                elif isinstance(leaf, np.generic):
                    out.append(a.astype(leaf.dtype)[()])
                else:
                    out.append(jnp.asarray(a, dtype=leaf.dtype))
            return jax.tree_util.tree_unflatten(treedef, out)

        plan.rebuild = rebuild

    saved_stores = {m["name"]: m for m in meta.get("stores", [])}
    unknown = sorted(set(stores) - set(saved_stores))
    if unknown:
        problems.append(f"no stand-alone memory {unknown} in the checkpoint (it holds {sorted(saved_stores) or 'none'})")
    for name, target in stores.items():
        if name not in saved_stores:
            continue
        entry = saved_stores[name]
        be = target.backend if isinstance(target, Store) else (target or backends.DEFAULT)
        be.check_restore(entry["backend"], name)
        tmpl = _store_template(entry, target, where)
        if check_memory(entry, tmpl, f"memory {name}"):
            plan.global_args.update(_global_args_for(entry, backends.of(tmpl), tmpl))
            plan.stores[name] = (entry, tmpl)
    if problems:
        raise ConfigMismatchError(f"{where} does not match the current configuration: " + " | ".join(problems))
    return plan


def _store_template(entry, target, where):
    """An empty memory of the saved shape on the target backend (or the target store's memory)."""
    if isinstance(target, Store):
        return target.mem
    spec = spec_from_json(entry["spec"], where=f"{where}, memory {entry['name']}")
    be = target if target is not None else backends.DEFAULT
    mem = memlib.empty(entry["d_in"], entry["d_out"], memlib.ROW_QUANTUM, row_dtype=jnp.dtype(entry["dtype"]),
                       spec=spec)
    return be.attach(mem, entry["name"])
