"""``growmem inspect`` and ``growmem export``: a checkpoint read without a model.

:func:`inspect` summarises a checkpoint and verifies every checksum — of its arrays and of the
cold rows on disk tiers it refers to (a damaged checkpoint or tier is reported as damaged, never
as healthy); :func:`export` writes every layer's rows as plain numpy (an ``.npz`` any tool can
read) plus a JSON description — rows on disk tiers and on every shard included.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
from typing import Dict, Optional

import jax
import numpy as np

from .. import kernels
from .. import memory as memlib
from ..backends import tier_files, tier_format, tier_stream
from .manager import Checkpointer, CheckpointError


def _open(directory) -> Checkpointer:
    return Checkpointer(directory, keep=None, create=False)


def _layer_summary(m: dict) -> dict:
    spec = m.get("spec") or {}
    b = m["backend"]
    out = {"layer": m["name"], "rows": m["size"], "hot": m["rows_hot"], "cold": m["rows_cold"],
           "capacity": m["capacity"], "d_in": m["d_in"], "d_out": m["d_out"], "bytes": m["bytes"],
           "dtype": m["dtype"], "backend": b["backend"],
           "kernel": spec.get("kernel") if isinstance(spec, dict) else None,
           "temperature": spec.get("temperature") if isinstance(spec, dict) else None,
           "policy": (m.get("policy") or {}).get("name")}
    if "tier" in b:
        out.update(cold_url=b["tier"]["url"], generation=b["tier"]["generation"])
    if b["backend"] == "sharded":
        out.update(shards=list(b["host_sizes"]), placement=b["placement"], next_shard=b["next_shard"],
                   capacity=b["capacity_per_shard"])
    return out


def _tier_refs(entry: dict):
    """The disk tiers a saved memory refers to (one, or one per shard)."""
    b = entry["backend"]
    return [b["tier"]] if "tier" in b else list(b.get("tiers") or [])


def _relocated(meta: dict, here: str) -> dict:
    """``meta`` with the cold tiers that lay inside the folder it was written in (``meta["directory"]``, e.g.
    the default spill folder CHECKPOINT_DIR/cold) looked up inside ``here``, where the checkpoint is read
    now: a copied or moved run folder is read with its own tiers, not the original's. Tiers outside that
    folder, and checkpoints that do not record it, are read where they were written."""
    saved = meta.get("directory")
    if not saved or saved == here or "://" in saved or "://" in here:
        return meta
    meta = copy.deepcopy(meta)
    for m in meta["memories"] + meta.get("stores", []):
        for ref in _tier_refs(m):
            path = tier_files.local_path(ref["url"])
            if path is None:
                continue
            rel = os.path.relpath(path, saved)
            if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
                ref["url"] = tier_files.url_of(os.path.join(here, rel))
    return meta


def inspect(directory, step: Optional[int] = None, *, verify: bool = True) -> dict:
    """A summary of a checkpoint (latest by default); with ``verify`` every array is read and
    checked against its CRC32, and the cold rows of every disk tier it refers to against the
    checksums written with them (:class:`CorruptCheckpointError` names the first bad file)."""
    ck = _open(directory)
    try:
        step = ck._pick(step)
        meta = _relocated(ck.read_meta(step), ck.directory)
        if verify:
            ck.verify(step)
            for m in meta["memories"] + meta.get("stores", []):
                for ref in _tier_refs(m):
                    _cold_tier(ref, m)
        layers = [_layer_summary(m) for m in meta["memories"] + meta.get("stores", [])]
        return {"directory": ck.directory, "step": meta["step"], "steps": ck.all_steps(),
                "created_at": meta["created_at"], "format_version": meta["format_version"],
                "growmem_version": meta.get("growmem_version"), "policy": meta.get("policy"),
                "data_position": meta.get("data_position"), "bytes": meta.get("bytes"), "verified": bool(verify),
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
             f"checksums    {'verified' if info.get('verified') else 'not checked'}",
             f"policy       {json.dumps(info['policy']) if info['policy'] is not None else '-'}",
             f"data order   {json.dumps(info['data_position']) if info['data_position'] is not None else '-'}",
             f"params       {info['params']} parametric values",
             f"bytes        {info['bytes']}",
             "",
             f"{'layer':<16}{'rows':>10}{'hot':>10}{'cold':>10}{'bytes':>14}  kernel (T), backend"]
    for l in info["layers"]:
        t = "" if l["temperature"] is None else f" (T={l['temperature']})"
        lines.append(f"{l['layer']:<16}{l['rows']:>10}{l['hot']:>10}{l['cold']:>10}{l['bytes']:>14}  "
                     f"{l['kernel']}{t}, {l['backend']}")
        if l.get("shards") is not None:
            sh = l["shards"]
            shown = ", ".join(map(str, sh if len(sh) <= 16 else sh[:8])) + ("" if len(sh) <= 16 else ", ...")
            lines.append(f"{'':<16}{len(sh)} shards × capacity {l['capacity']} ({l['placement']}), rows per shard: "
                         f"[{shown}]")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- rows of a saved memory

def _cold_tier(ref: dict, entry: dict, verify: bool = True):
    """The disk tier a checkpoint refers to, opened read-only and checked (run, generation, rows)
    and, with ``verify``, its cold rows against their checksums: ``ColdTier.checked``."""
    try:
        return tier_format.ColdTier.checked(ref, f"layer {entry['name']}", read_only=True, verify=verify)
    except tier_files.TierError as e:
        raise CheckpointError(str(e)) from None


def _cold_rows(ref: dict, entry: dict) -> Dict[str, np.ndarray]:
    """The cold rows a checkpoint refers to (read-only, checked as they are read), with the weight
    decay they missed."""
    tier = _cold_tier(ref, entry, verify=False)
    n = int(ref["rows_cold"])
    parts = {f: [] for f in memlib.FIELDS}
    for rows, m in tier.chunks(n=n, verify=True):
        for f in memlib.FIELDS:
            parts[f].append(np.asarray(rows[f][:m]))
    shapes = tier.shapes()
    rows = {f: (np.concatenate(p) if p else np.zeros((0,) + shapes[f], tier.dt(f))) for f, p in parts.items()}
    spill = ref.get("spill") or {}
    retention = float((entry.get("policy") or {}).get("retention", 1.0))
    weighted = kernels.get((entry.get("spec") or {}).get("kernel", "weighted_softmax")).normalised
    return tier_stream.aged(rows, 0, spill.get("seg_start", ()), spill.get("seg_t", ()), int(entry["t"]), retention,
                           weighted)


def saved_rows(entry: dict, arrays: dict) -> Dict[str, np.ndarray]:
    """Every row of a saved memory as numpy: cold before hot, shard by shard."""
    b = entry["backend"]
    fields = {f: np.asarray(arrays[slot.get("host") or slot.get("global")]) for f, slot in entry["arrays"].items()}
    if b["backend"] == "sharded":
        cs = int(b["capacity_per_shard"])
        parts = []
        for j, n in enumerate(b["host_sizes"]):
            if "tiers" in b:
                parts.append(_cold_rows(b["tiers"][j], entry))
            parts.append({f: fields[f][j * cs:j * cs + int(n)] for f in memlib.FIELDS})
        return {f: np.concatenate([p[f] for p in parts]) for f in memlib.FIELDS}
    if b["backend"] == "tiered":
        cold = _cold_rows(b["tier"], entry)
        return {f: np.concatenate([cold[f], fields[f]]) for f in memlib.FIELDS}
    return fields


def _write_all(files):
    """``files``: ``[(path, write), ...]``; each ``write(file object)`` goes into a temporary file beside its
    path, and only once every one is written are they renamed onto their paths. A failure removes the
    temporary files and leaves every path as it was (an earlier export under the same name included)."""
    tmps = []
    try:
        for path, write in files:
            folder = os.path.dirname(os.path.abspath(path)) or "."
            fd, tmp = tempfile.mkstemp(prefix=".growmem-export-", dir=folder)
            tmps.append(tmp)
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        for tmp in tmps:
            try:
                os.remove(tmp)
            except OSError:
                pass
        raise
    for (path, _), tmp in zip(files, tmps):
        os.replace(tmp, path)


def export(directory, npz_path, step: Optional[int] = None) -> dict:
    """Write the rows of every layer as plain numpy arrays to ``npz_path`` (exactly that name)
    and the description to ``npz_path + ".json"``.

    Arrays are named ``<layer>/w``, ``<layer>/k``, ``<layer>/v``, ``<layer>/born`` (cold rows
    first, then hot; shard by shard — gathering every shard needs a single process). The npz
    also holds ``__description__`` (kernels, temperatures, rules, shapes, step). Both files are
    written to temporary files and renamed once both are complete: a failure (a full disk, an
    unwritable folder) leaves no partial file and the files it would have replaced as they were.
    Returns the description.
    """
    npz_path = os.fspath(npz_path)
    folder = os.path.dirname(os.path.abspath(npz_path))
    if os.path.isdir(npz_path):
        raise CheckpointError(f"export target {npz_path} is a folder; pass a file name, e.g. {npz_path}/rows.npz")
    if not os.path.isdir(folder):
        raise CheckpointError(f"export target folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise CheckpointError(f"export target folder {folder} is not writable")
    ck = _open(directory)
    try:
        step = ck._pick(step)
        meta = _relocated(ck.read_meta(step), ck.directory)
        entries = meta["memories"] + meta.get("stores", [])
        if any(e["backend"]["backend"] == "sharded" for e in entries) and jax.process_count() > 1:
            raise CheckpointError(f"export gathers the rows of the sharded layers into one process; run it in a "
                                  f"single process (this is process {jax.process_index()} of {jax.process_count()})")
        host = ck._ocp.RestoreArgs(restore_type=np.ndarray)
        globals_ = {slot["global"]: host for e in entries for slot in e["arrays"].values() if "global" in slot}
        arrays = ck.read_arrays(step, meta, globals_)
    finally:
        ck.close()
    out, layers = {}, {}
    for m in entries:
        rows = saved_rows(m, arrays)
        for f in memlib.FIELDS:
            out[f"{m['name']}/{f}"] = rows[f]
        spec = m.get("spec") or {}
        layers[m["name"]] = {"rows": m["size"], "rows_cold": m["rows_cold"], "d_in": m["d_in"], "d_out": m["d_out"],
                             "t": m["t"], "spec": spec, "backend": m["backend"]["backend"],
                             "kernel": spec.get("kernel"), "temperature": spec.get("temperature"),
                             "momentum": spec.get("momentum"), "policy": m.get("policy")}
        if m["backend"]["backend"] == "sharded":
            layers[m["name"]].update(shards=list(m["backend"]["host_sizes"]), placement=m["backend"]["placement"])
    desc = {"format": "growmem-export", "source": os.path.abspath(os.fspath(directory)), "step": meta["step"],
            "created_at": meta["created_at"], "format_version": meta["format_version"],
            "value_convention": "v holds ṽ = w·v for the weighted_softmax kernel (Eq. 8), v otherwise",
            "born_convention": "creation step of each row; -1 for initial rows",
            "layers": layers, "policy": meta.get("policy")}
    text = json.dumps(desc)
    try:   # both written before either replaces a file: never one without the other, never an old one lost
        _write_all([(npz_path, lambda f: np.savez(f, __description__=np.asarray(text), **out)),
                    (npz_path + ".json", lambda f: f.write(json.dumps(desc, indent=2).encode()))])
    except OSError as e:
        reason = "the disk is full" if getattr(e, "errno", None) == 28 else (e.strerror or str(e))
        raise CheckpointError(f"writing {npz_path} failed ({reason}); nothing was written") from None
    return desc
