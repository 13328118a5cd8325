"""MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100: find, download, verify, read.

Where a dataset is looked for (first complete folder wins), ``NAME`` being ``mnist``,
``fashion_mnist``, ``cifar10`` or ``cifar100``:

1. an explicit ``data_dir``: ``data_dir/NAME/``, then ``data_dir`` itself — and nowhere else.
   A ``data_dir`` that does not exist is an error (no fallback).
2. otherwise ``$GROWMEM_DATA/NAME/`` (for ``mnist`` also ``$GROWMEM_DATA`` itself),
3. ``${XDG_CACHE_HOME:-~/.cache}/growmem/NAME/``,
4. system folders: Fashion-MNIST from the Debian/Ubuntu package ``dataset-fashion-mnist``
   (``apt-get install dataset-fashion-mnist``) in ``/usr/share/datasets/fashion-mnist/``.

When nothing is found and ``download=True``, the files are fetched from the official
sources (:data:`DATASETS`, or the ``mirrors`` argument) into :func:`cache_dir`: ``data_dir/NAME/``,
else ``$GROWMEM_DATA/NAME/``, else ``${XDG_CACHE_HOME:-~/.cache}/growmem/NAME/``.
``download=False`` never touches the network.

Integrity. Every file is checked against a pinned checksum before it is kept or used:

* MNIST / Fashion-MNIST: SHA-256 of the *decompressed* IDX content. (The published MD5s are of
  the ``.gz`` wrappers, which mirrors and the Debian package recompress; the content is the same.)
  The pins equal the content of the real files (the MNIST copy in the project's shared data,
  the Debian package's Fashion-MNIST) and the published hashes of the decompressed files.
* CIFAR: MD5 of the ``.tar.gz`` as published by the authors (and torchvision), and MD5 of
  every pickle in it (as published by torchvision), checked again before each unpickling.
  The pickles are read with a restricted unpickler that only builds numpy arrays.

Downloads go to a temporary file in the target folder, are verified, then ``os.replace``-d
into place; on any failure (including KeyboardInterrupt) the temporary file is removed.
CIFAR archives are extracted into a temporary folder that is renamed into place when complete.

Arrays: ``x`` float32 in [0, 1], ``y`` int32. MNIST-like: ``(n, 784)`` or ``(n, 28, 28)``.
CIFAR: ``(n, 32, 32, 3)`` channel-last (height, width, RGB), flattened to ``(n, 3072)`` in that
order (index ``(h * 32 + w) * 3 + c``) — not the channel-first order of the pickles.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import json
import os
import pickle
import shutil
import struct
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, GrowmemError

__all__ = [
    "DATASETS", "DatasetSpec", "DatasetError", "DatasetNotFoundError", "CorruptDatasetError",
    "load", "locate", "download", "available", "search_dirs", "cache_dir", "read_idx", "names",
    "DatasetStatus", "status", "verify", "CHECKSUMS_ENV",
]


class DatasetError(GrowmemError):
    """Base class of the errors raised by :mod:`growmem.data`."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """The dataset is not on this machine and could not be downloaded (or ``download=False``).

    Attributes: ``dataset``, ``searched`` (folders looked in), ``attempts`` (``(url, error)`` pairs
    of the downloads tried), ``target`` (where the files belong)."""

    def __init__(self, message: str, *, dataset: str = "", searched: Sequence[Path] = (),
                 attempts: Sequence[Tuple[str, str]] = (), target: Optional[Path] = None):
        super().__init__(message)
        self.dataset, self.searched, self.attempts, self.target = dataset, list(searched), list(attempts), target


class CorruptDatasetError(DatasetError, OSError, ValueError):
    """A dataset file is damaged or is not the expected file (an ``OSError`` and a ``ValueError``).

    Attribute ``path``: the offending file."""

    def __init__(self, message: str, path=None):
        super().__init__(message)
        self.path = None if path is None else Path(path)


# --------------------------------------------------------------------------- specs

_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
_IDX_SPLITS = {"train": _MNIST_FILES[:2], "test": _MNIST_FILES[2:]}


@dataclass(frozen=True)
class DatasetSpec:
    """What one dataset is made of and where it comes from.

    ``files``: the names downloaded (``mirror + name``) and kept in the cache folder.
    ``checksums``: ``name -> hex digest`` (32 hex digits: MD5, 64: SHA-256); for IDX files the
    digest of the decompressed content, for CIFAR the archive's and each pickle's (``members``).
    """
    name: str
    kind: str  # "idx" or "cifar"
    files: Tuple[str, ...]
    mirrors: Tuple[str, ...]
    checksums: Mapping[str, str]
    num_classes: int
    image_shape: Tuple[int, ...]
    splits: Mapping[str, Tuple[str, ...]]
    folder: str = ""  # cifar: the folder inside the archive
    members: Tuple[str, ...] = ()  # cifar: the pickles inside ``folder``
    label_keys: Mapping[str, Tuple[bytes, int]] = field(default_factory=dict)  # cifar: labels -> (key, classes)
    system_dirs: Tuple[str, ...] = ()
    homepage: str = ""
    published_md5: Mapping[str, str] = field(default_factory=dict)  # informational (.gz wrappers)


DATASETS: Dict[str, DatasetSpec] = {
    "mnist": DatasetSpec(
        name="mnist", kind="idx", files=_MNIST_FILES,
        mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "https://storage.googleapis.com/cvdf-datasets/mnist/"),
        checksums={  # sha256 of the decompressed IDX files
            "train-images-idx3-ubyte.gz": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte.gz": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        published_md5={
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
        num_classes=10, image_shape=(28, 28), splits=_IDX_SPLITS,
        homepage="http://yann.lecun.com/exdb/mnist/"),
    "fashion_mnist": DatasetSpec(
        name="fashion_mnist", kind="idx", files=_MNIST_FILES,
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        checksums={  # sha256 of the decompressed IDX files
            "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
        published_md5={
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        num_classes=10, image_shape=(28, 28), splits=_IDX_SPLITS,
        system_dirs=("/usr/share/datasets/fashion-mnist",),
        homepage="https://github.com/zalandoresearch/fashion-mnist"),
    "cifar10": DatasetSpec(
        name="cifar10", kind="cifar", files=("cifar-10-python.tar.gz",),
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        checksums={  # md5, as published by the authors / torchvision
            "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
            "data_batch_1": "c99cafc152244af753f735de768cd75f",
            "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
            "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
            "data_batch_4": "634d18415352ddfa80567beed471001a",
            "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
            "test_batch": "40351d587109b95175f43aff81a1287e",
            "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
        },
        num_classes=10, image_shape=(32, 32, 3),
        splits={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
        folder="cifar-10-batches-py",
        members=tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta"),
        label_keys={"fine": (b"labels", 10)},
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html"),
    "cifar100": DatasetSpec(
        name="cifar100", kind="cifar", files=("cifar-100-python.tar.gz",),
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        checksums={  # md5, as published by the authors / torchvision
            "cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85",
            "train": "16019d7e3df5f24257cddd939b257f8d",
            "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
            "meta": "7973b15100ade9c7d40fb424638fde48",
        },
        num_classes=100, image_shape=(32, 32, 3), splits={"train": ("train",), "test": ("test",)},
        folder="cifar-100-python", members=("train", "test", "meta"),
        label_keys={"fine": (b"fine_labels", 100), "coarse": (b"coarse_labels", 20)},
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html"),
}

#: how long one network read may stall before the download attempt fails (seconds)
TIMEOUT = 60.0


def names() -> List[str]:
    """The dataset names :func:`load` accepts."""
    return sorted(DATASETS)


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"unknown dataset {name!r}; choose one of {names()}") from None


# --------------------------------------------------------------------------- folders

def _home_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "growmem"


def _explicit_dir(name: str, data_dir) -> Path:
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DatasetNotFoundError(
            f"{name}: data_dir {root} does not exist (or is not a folder). An explicit data_dir is used "
            f"as given, with no fallback: create it (downloads go to {root / name}), pass the folder that "
            f"holds the files, or leave data_dir unset to use $GROWMEM_DATA/{name} or {_home_cache() / name}.",
            dataset=name, searched=[root], target=root / name)
    return root


def search_dirs(name: str, data_dir=None) -> List[Path]:
    """The folders searched for dataset ``name``, in order (see the module docstring)."""
    spec = _spec(name)
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        return [root / name, root]
    out = []
    env = os.environ.get("GROWMEM_DATA")
    if env:
        out.append(Path(env).expanduser() / name)
        if name == "mnist":  # the layout growmem.data.mnist always accepted
            out.append(Path(env).expanduser())
    out.append(_home_cache() / name)
    out += [Path(p) for p in spec.system_dirs]
    return out


def cache_dir(name: str, data_dir=None) -> Path:
    """Where a download of ``name`` goes: ``data_dir/NAME``, ``$GROWMEM_DATA/NAME`` or
    ``${XDG_CACHE_HOME:-~/.cache}/growmem/NAME``."""
    _spec(name)
    if data_dir is not None:
        return Path(data_dir).expanduser() / name
    env = os.environ.get("GROWMEM_DATA")
    return (Path(env).expanduser() if env else _home_cache()) / name


def _idx_path(folder: Path, fname: str) -> Optional[Path]:
    """``fname`` (``*.gz``) in ``folder``, or its decompressed twin; None if neither is there."""
    for p in (folder / fname, folder / fname[:-3]):
        if p.is_file():
            return p
    return None


def _missing(spec: DatasetSpec, folder: Path) -> List[str]:
    if spec.kind == "idx":
        return [f for f in spec.files if _idx_path(folder, f) is None]
    return [f"{spec.folder}/{m}" for m in spec.members if not (folder / spec.folder / m).is_file()]


def available(name: str, data_dir=None) -> bool:
    """Whether ``name``'s files (or, for CIFAR, its archive) are in a searched folder. No network,
    no verification."""
    spec = _spec(name)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        return False
    for d in search_dirs(name, data_dir):
        if not _missing(spec, d) or (spec.kind == "cifar" and (d / spec.files[0]).is_file()):
            return True
    return False


# --------------------------------------------------------------------------- checksums

def _digest(data: bytes, expected: str) -> str:
    if len(expected) == 32:
        return hashlib.md5(data).hexdigest()
    if len(expected) == 64:
        return hashlib.sha256(data).hexdigest()
    raise ConfigError(f"checksum {expected!r}: expected 32 (md5) or 64 (sha256) hex digits")


def _file_digest(path: Path, expected: str) -> str:
    h = hashlib.md5() if len(expected) == 32 else hashlib.sha256() if len(expected) == 64 else None
    if h is None:
        raise ConfigError(f"checksum {expected!r}: expected 32 (md5) or 64 (sha256) hex digits")
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: environment variable naming a JSON file of checksum overrides, ``{"mnist": {"<file>": "<hex digest>"}}``:
#: an explicit choice (for a private copy, or generated test data), never a silent fallback
CHECKSUMS_ENV = "GROWMEM_DATA_CHECKSUMS"


def env_checksums(name: str) -> Dict[str, str]:
    """The overrides ``$GROWMEM_DATA_CHECKSUMS`` gives for dataset ``name`` (``{}`` when unset).

    A file that cannot be read, is not JSON of that shape, names a file the dataset does not have
    or gives a digest that is neither MD5 nor SHA-256 raises :class:`DatasetError` naming it."""
    path = os.environ.get(CHECKSUMS_ENV)
    if not path:
        return {}
    spec = _spec(name)
    fix = f"fix the file or unset {CHECKSUMS_ENV} to check against the published checksums"
    try:
        table = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(f"${CHECKSUMS_ENV}={path}: cannot be read as JSON ({e}); {fix}") from None
    entry = table.get(name, {}) if isinstance(table, dict) else None
    if not isinstance(entry, dict):
        raise DatasetError(f"${CHECKSUMS_ENV}={path}: expected {{dataset: {{file: hex digest}}}}; {fix}")
    known = set(spec.checksums)
    for fname, digest in entry.items():
        if fname not in known:
            raise DatasetError(f"${CHECKSUMS_ENV}={path}: {name} has no file {fname!r} (its files: "
                               f"{sorted(known)}); {fix}")
        if not (isinstance(digest, str) and len(digest) in (32, 64)
                and all(c in "0123456789abcdefABCDEF" for c in digest)):
            raise DatasetError(f"${CHECKSUMS_ENV}={path}: {name}/{fname}: {digest!r} is not an MD5 or SHA-256 "
                               f"hex digest; {fix}")
    return {k: v.lower() for k, v in entry.items()}


def _checksums(spec: DatasetSpec, override: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The digests files are checked against: the pinned ones, then ``$GROWMEM_DATA_CHECKSUMS``'s, then
    the caller's ``checksums`` argument (each an explicit override of the one before)."""
    out = {**spec.checksums, **env_checksums(spec.name), **(override or {})}
    return {k: v.lower() for k, v in out.items()}


def _algo(expected: str) -> str:
    return "md5" if len(expected) == 32 else "sha256"


# --------------------------------------------------------------------------- IDX

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_FIX = "Delete it and load again to download a fresh copy (or replace it by hand)."


def _idx_bytes(path: Path) -> bytes:
    """The decompressed bytes of an IDX file (gzipped or not), or a CorruptDatasetError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CorruptDatasetError(f"{path}: cannot be read ({e}).", path) from e
    if data[:2] == b"\x1f\x8b":  # gzip magic
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise CorruptDatasetError(f"{path}: damaged gzip file, probably truncated ({e}). {_FIX}", path) from e
    return data


def _parse_idx(data: bytes, path) -> np.ndarray:
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        what = "gzip nor IDX" if data[:1] != b"<" else "gzip nor IDX (it looks like an HTML page)"
        raise CorruptDatasetError(f"{path}: not an IDX file (bad magic number; neither {what}). {_FIX}", path)
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise CorruptDatasetError(f"{path}: unknown IDX element type 0x{code:02x}. {_FIX}", path)
    if len(data) < 4 + 4 * ndim:
        raise CorruptDatasetError(f"{path}: IDX header cut short ({len(data)} bytes). {_FIX}", path)
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[code])
    body = len(data) - 4 - 4 * ndim
    if body != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise CorruptDatasetError(
            f"{path}: IDX header says shape {tuple(shape)} ({int(np.prod(shape, dtype=np.int64)) * dtype.itemsize} "
            f"bytes of data) but the file holds {body} bytes. {_FIX}", path)
    return np.frombuffer(data, dtype=dtype, offset=4 + 4 * ndim).reshape(shape)


def read_idx(path) -> np.ndarray:
    """Read one IDX file (gzipped or not) into an array of its stored shape and type.

    Raises :class:`CorruptDatasetError` (a ``ValueError``) naming the file for a damaged gzip,
    a file that is not IDX, or a header that disagrees with the file's size."""
    path = Path(path)
    return _parse_idx(_idx_bytes(path), path)


def _read_idx_split(spec: DatasetSpec, folder: Path, split: str, checksums: Mapping[str, str]):
    paths = []
    for fname in spec.splits[split]:
        p = _idx_path(folder, fname)
        if p is None:
            raise DatasetNotFoundError(f"{spec.name}: {folder / fname} is missing.", dataset=spec.name,
                                       searched=[folder], target=folder)
        paths.append(p)
    raw = [_idx_bytes(p) for p in paths]
    images, labels = (_parse_idx(b, p) for b, p in zip(raw, paths))
    ip, lp = paths
    if images.ndim != 3 or images.shape[1:] != spec.image_shape or images.dtype != np.uint8:
        raise CorruptDatasetError(f"{ip}: expected uint8 images of shape (n, 28, 28), found {images.dtype} "
                                  f"{images.shape}. {_FIX}", ip)
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise CorruptDatasetError(f"{lp}: expected a 1-d uint8 label file, found {labels.dtype} {labels.shape}. "
                                  f"{_FIX}", lp)
    if len(images) != len(labels):
        raise CorruptDatasetError(f"{lp}: {len(labels)} labels but {ip.name} holds {len(images)} images. "
                                  f"{_FIX} (both files of the pair may need replacing)", lp)
    if len(labels) and int(labels.max()) >= spec.num_classes:
        raise CorruptDatasetError(f"{lp}: label {int(labels.max())} is out of range for {spec.name} "
                                  f"(0..{spec.num_classes - 1}). {_FIX}", lp)
    for b, p, fname in zip(raw, paths, spec.splits[split]):
        _check(spec, p, fname, _digest(b, checksums[fname]), checksums[fname], "decompressed content of ")
    return images, labels


def _check(spec, path, key, got, expected, what=""):
    if got != expected:
        raise CorruptDatasetError(
            f"{path}: {_algo(expected)} of the {what}file is {got}, expected {expected} — it is damaged or not "
            f"{spec.name}'s {key}. {_FIX}", path)


# --------------------------------------------------------------------------- CIFAR pickles

# Only what a pickled numpy array needs; anything else in a pickle is refused.
_ALLOWED_GLOBALS = {
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 writes bytes in protocol-2 pickles
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        canonical = module.replace("numpy.core", "numpy._core", 1) if module.startswith("numpy.core") else module
        if (canonical, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        for mod in (canonical, canonical.replace("numpy._core", "numpy.core", 1)):  # numpy 2 / numpy 1
            try:
                return getattr(importlib.import_module(mod), name)
            except (ImportError, AttributeError):
                continue
        raise pickle.UnpicklingError(f"cannot find {module}.{name}")


def _load_pickle(spec: DatasetSpec, path: Path, checksums: Mapping[str, str]):
    """Unpickle one CIFAR file, only after its checksum verified."""
    member = path.name
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptDatasetError(f"{path}: cannot be read ({e}).", path) from e
    _check(spec, path, member, _digest(data, checksums[member]), checksums[member])
    try:
        return _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as e:
        raise CorruptDatasetError(f"{path}: not a CIFAR pickle ({type(e).__name__}: {e}). {_FIX}", path) from e


def _read_cifar_split(spec: DatasetSpec, folder: Path, split: str, labels: str,
                      checksums: Mapping[str, str], limit: Optional[int]):
    if labels not in spec.label_keys:
        raise ConfigError(f"{spec.name}: labels must be one of {sorted(spec.label_keys)}, got {labels!r}")
    key, classes = spec.label_keys[labels]
    xs, ys, n = [], [], 0
    for member in spec.splits[split]:
        if limit is not None and n >= limit and xs:
            break
        path = folder / member
        d = _load_pickle(spec, path, checksums)
        x = d.get(b"data") if isinstance(d, dict) else None
        y = d.get(key) if isinstance(d, dict) else None
        if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072:
            raise CorruptDatasetError(f"{path}: expected b'data' as a uint8 array (n, 3072). {_FIX}", path)
        try:
            y = np.asarray(y, dtype=np.int64)
        except (TypeError, ValueError):
            y = None
        if y is None or y.ndim != 1 or len(y) != len(x):
            raise CorruptDatasetError(f"{path}: expected {key!r} with one label per image ({len(x)}). {_FIX}", path)
        if len(y) and (y.min() < 0 or y.max() >= classes):
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise CorruptDatasetError(f"{path}: label {bad} is out of range for {spec.name} {labels} labels "
                                      f"(0..{classes - 1}). {_FIX}", path)
        xs.append(x)
        ys.append(y)
        n += len(x)
    x, y = np.concatenate(xs), np.concatenate(ys)
    # pickles store (3, 32, 32) channel-first rows; return channel-last (32, 32, 3)
    return x.reshape(len(x), 3, 32, 32).transpose(0, 2, 3, 1), y


def _extract(spec: DatasetSpec, archive: Path, dest: Path, checksums: Mapping[str, str]) -> Path:
    """Verify ``archive``, then extract its pickles into ``dest/spec.folder`` (atomically)."""
    key = spec.files[0]
    _check(spec, archive, key, _file_digest(archive, checksums[key]), checksums[key])
    final = dest / spec.folder
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.folder}.", suffix=".tmp", dir=dest))
    try:
        wanted = {f"{spec.folder}/{m}": m for m in spec.members}
        try:
            with tarfile.open(archive, "r:gz") as tf:
                for info in tf:
                    member = wanted.get(info.name.lstrip("./"))
                    if member is None or not info.isfile():
                        continue
                    data = tf.extractfile(info).read()
                    _check(spec, f"{archive}:{info.name}", member, _digest(data, checksums[member]), checksums[member])
                    (tmp / member).write_bytes(data)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            if isinstance(e, CorruptDatasetError) or (isinstance(e, OSError) and e.errno is not None):
                raise  # already explained, or a problem of the disk (full, read-only), not of the archive
            raise CorruptDatasetError(f"{archive}: cannot be extracted ({e}). {_FIX}", archive) from e
        lacking = [m for m in spec.members if not (tmp / m).is_file()]
        if lacking:
            raise CorruptDatasetError(f"{archive}: lacks {', '.join(f'{spec.folder}/{m}' for m in lacking)}. "
                                      f"{_FIX}", archive)
        if final.is_dir():  # e.g. a damaged pickle was deleted: put back the missing ones, each atomically
            for m in spec.members:
                if not (final / m).is_file():
                    os.replace(tmp / m, final / m)
        else:
            try:
                os.rename(tmp, final)
            except OSError:
                if _missing(spec, dest):  # not a finished copy made meanwhile by another process
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------- download

def _say(msg: str) -> None:
    print(f"growmem.data: {msg}", file=sys.stderr, flush=True)


def _part_path(folder: Path, fname: str) -> Path:
    """Where a resumable download keeps the bytes received so far (never read as data)."""
    return folder / f".{fname}.part"


def _fetch(url: str, folder: Path, fname: str, verify: Callable[[Path], None], timeout: float,
           resume: bool = False) -> Path:
    """Download ``url`` to ``folder/fname`` through a verified temporary file.

    ``resume=False``: the temporary file is removed on any failure. ``resume=True``: it is
    ``folder/.fname.part``, kept when the transfer breaks and continued with an HTTP ``Range``
    request next time (a server that ignores the range sends the whole file again); a file that
    fails verification is removed either way."""
    if resume:
        tmp: Optional[Path] = _part_path(folder, fname)
        have = tmp.stat().st_size if tmp.is_file() else 0
        fd = None
    else:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{fname}.", suffix=".part", dir=folder)
        tmp, have = Path(tmp_name), 0
    keep_on_failure = resume
    try:
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            resp = urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            if not (have and e.code == 416):  # 416: the kept part is already the whole file
                raise
            resp = None
        if resp is not None:
            with resp:
                if have and resp.status != 206:
                    have = 0  # the server sent the whole file: start over
                with (os.fdopen(fd, "wb") if fd is not None else open(tmp, "ab" if have else "wb")) as out:
                    fd = None
                    length = resp.headers.get("Content-Length")
                    got = 0
                    while True:
                        chunk = resp.read(1 << 20)
                        if not chunk:
                            break
                        out.write(chunk)
                        got += len(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                    if length is not None and length.strip().isdigit() and got != int(length):
                        raise OSError(f"transfer incomplete: received {got} of {int(length)} bytes"
                                      + (f" ({have + got} bytes kept in {tmp.name}; run the download again to "
                                         f"resume)" if resume else ""))
        keep_on_failure = False  # the transfer is complete: a file that fails verification is not kept
        verify(tmp)
        target = folder / fname
        os.replace(tmp, target)
        tmp = None
        return target
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None and not keep_on_failure:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass


def _reason(e: Exception) -> str:
    """One line on why a download attempt failed (without the temporary file's name)."""
    if isinstance(e, CorruptDatasetError):
        msg = str(e).replace(f"{e.path}: ", "").replace(f" {_FIX}", "")
        return msg if msg.startswith("checksum mismatch") else f"not a valid file: {msg}"
    return f"{type(e).__name__}: {e}"


def _verifier(spec: DatasetSpec, fname: str, checksums: Mapping[str, str]) -> Callable[[Path], None]:
    expected = checksums[fname]

    def verify(path: Path) -> None:
        if spec.kind == "idx":
            data = _idx_bytes(path)
            _parse_idx(data, path)
            got = _digest(data, expected)
            what = "decompressed content"
        else:
            got, what = _file_digest(path, expected), "file"
        if got != expected:
            raise CorruptDatasetError(f"checksum mismatch: {_algo(expected)} of the {what} is {got}, "
                                      f"expected {expected}", path)
    return verify


def _fetch_all(spec: DatasetSpec, folder: Path, mirrors: Sequence[str], checksums: Mapping[str, str],
              timeout: float, fnames: Sequence[str], resume: bool = False) -> List[Tuple[str, str]]:
    """Fetch ``fnames`` into ``folder`` (made if needed). Returns the failed attempts; empty = success."""
    attempts: List[Tuple[str, str]] = []
    for fname in fnames:
        for base in mirrors:
            url = (base if base.endswith("/") else base + "/") + fname
            _say(f"downloading {url} -> {folder}/ (a mirror silent for {timeout:g} s is skipped)")
            try:
                _fetch(url, folder, fname, _verifier(spec, fname, checksums), timeout, resume)
                break
            except Exception as e:  # try the next mirror; KeyboardInterrupt propagates
                attempts.append((url, _reason(e)))
        else:
            return attempts
    return []


def _how_to_place(spec: DatasetSpec, target: Path, mirrors: Sequence[str]) -> str:
    base = mirrors[0] if mirrors else spec.mirrors[0]
    base = base if base.endswith("/") else base + "/"
    if spec.kind == "idx":
        lines = [f"To place the files by hand, download the four gzipped IDX files and put them, still gzipped "
                 f"and with exactly these names, into {target}/ :"]
        lines += [f"    {f}  ({base}{f})" for f in spec.files]
        if len(mirrors) > 1:
            lines.append("  Any of these mirrors serves the same files: " + ", ".join(mirrors))
        lines.append(f"  (or pass data_dir=DIR / set GROWMEM_DATA=DIR and put them in DIR/{spec.name}/).")
        if spec.system_dirs:
            lines.append(f"  On Debian/Ubuntu, `apt-get install dataset-{spec.name.replace('_', '-')}` installs them "
                         f"into {spec.system_dirs[0]}/, which is searched too.")
    else:
        lines = [f"To place the files by hand, download {base}{spec.files[0]} and put it, with exactly that name, "
                 f"into {target}/ (it is verified and extracted on the next load), or extract it there yourself "
                 f"so that {target}/{spec.folder}/ holds {', '.join(spec.members)}",
                 f"  (or pass data_dir=DIR / set GROWMEM_DATA=DIR and use DIR/{spec.name}/)."]
    return "\n".join(lines)


def _not_found(spec, searched, target, attempts, mirrors, download: bool) -> DatasetNotFoundError:
    lines = [f"{spec.name} not found. Searched:"]
    for d in searched:
        miss = _missing(spec, d) if d.is_dir() else None
        lines.append(f"  {d}  ({'does not exist' if miss is None else 'missing ' + ', '.join(miss)})")
    if not download:
        lines.append(f"Nothing was downloaded (download=False). Fetch it with `growmem data download {spec.name}` "
                     f"(or growmem.data.load({spec.name!r}, download=True)): the files go into {target}/.")
    elif attempts:
        lines.append(f"Downloading into {target}/ failed (`growmem data download {spec.name}` tries again, "
                     f"resuming a broken transfer):")
        lines += [f"  {url}: {err}" for url, err in attempts]
    lines.append(_how_to_place(spec, target, mirrors))
    return DatasetNotFoundError("\n".join(lines), dataset=spec.name, searched=searched, attempts=attempts,
                                target=target)


def download(name: str, folder, *, mirrors: Optional[Sequence[str]] = None,
             checksums: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT,
             resume: bool = False) -> Path:
    """Download ``name``'s files into exactly ``folder`` (made if needed; files already there are
    kept), verify them, and for CIFAR extract the pickles. Returns ``folder``.

    ``mirrors``: base URLs tried in order (each file is ``base + file name``); ``checksums``:
    overrides of :attr:`DatasetSpec.checksums` (for a private mirror or a test server).
    ``resume``: keep the bytes of a broken transfer in ``folder/.FILE.part`` and continue from them
    on the next call (``growmem data download`` does this)."""
    return _download_into(name, folder, mirrors=mirrors, checksums=checksums, timeout=timeout, resume=resume)


def _download_into(name: str, folder, *, mirrors: Optional[Sequence[str]] = None,
                   checksums: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT,
                   resume: bool = False) -> Path:
    spec = _spec(name)
    folder = Path(folder).expanduser()
    mirrors = tuple(mirrors) if mirrors is not None else spec.mirrors
    sums = _checksums(spec, checksums)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if spec.kind == "idx":
            todo = [f for f in spec.files if _idx_path(folder, f) is None]
        else:
            todo = [] if not _missing(spec, folder) or (folder / spec.files[0]).is_file() else list(spec.files)
        attempts = _fetch_all(spec, folder, mirrors, sums, timeout, todo, resume)
        if attempts:
            raise _not_found(spec, [folder], folder, attempts, mirrors, True)
        if spec.kind == "cifar" and _missing(spec, folder):
            _extract(spec, folder / spec.files[0], folder, sums)
    finally:
        if made:
            try:
                folder.rmdir()  # only succeeds when empty: nothing was kept
            except OSError:
                pass
    return folder


def locate(name: str, data_dir=None, *, download: bool = True, mirrors: Optional[Sequence[str]] = None,
           checksums: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT) -> Path:
    """The folder holding ``name``'s files (for CIFAR: the extracted pickles), downloading them into
    :func:`cache_dir` when no searched folder has them and ``download`` is true."""
    spec = _spec(name)
    if data_dir is not None:
        _explicit_dir(name, data_dir)
    searched = search_dirs(name, data_dir)
    sums = _checksums(spec, checksums)
    for d in searched:
        if not _missing(spec, d):
            return d / spec.folder if spec.kind == "cifar" else d
    if spec.kind == "cifar":
        for d in searched:
            archive = d / spec.files[0]
            if archive.is_file():
                dest = d if os.access(d, os.W_OK) else cache_dir(name, data_dir)
                dest.mkdir(parents=True, exist_ok=True)
                return _extract(spec, archive, dest, sums)
    mirrors = tuple(mirrors) if mirrors is not None else spec.mirrors
    target = cache_dir(name, data_dir)
    if not download:
        raise _not_found(spec, searched, target, [], mirrors, False)
    try:
        _download_into(name, target, mirrors=mirrors, checksums=sums, timeout=timeout)
    except DatasetNotFoundError as e:
        raise _not_found(spec, searched if target in searched else searched + [target], target, e.attempts,
                         mirrors, True) from None
    return target / spec.folder if spec.kind == "cifar" else target


def load(name: str, split: str = "train", data_dir=None, download: bool = True, limit: Optional[int] = None, *,
         flatten: bool = True, labels: str = "fine", dtype=np.float32, mirrors: Optional[Sequence[str]] = None,
         checksums: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT) -> Tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one split of ``name`` (``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``).

    ``x``: ``dtype`` pixels in [0, 1]; MNIST-like ``(n, 784)`` or, with ``flatten=False``, ``(n, 28, 28)``;
    CIFAR ``(n, 3072)`` or ``(n, 32, 32, 3)`` (channel-last, flattened in height-width-channel order).
    ``y``: int32 class ids. ``limit``: keep the first ``limit`` samples. ``labels``: CIFAR-100
    ``"fine"`` (100 classes, default) or ``"coarse"`` (20 superclasses).

    Looks in :func:`search_dirs`, downloads into :func:`cache_dir` if needed and ``download``.
    Raises :class:`DatasetNotFoundError` (a FileNotFoundError) when the data is absent and cannot be
    downloaded, :class:`CorruptDatasetError` (an OSError and ValueError) for a damaged file."""
    spec = _spec(name)
    if split not in spec.splits:
        raise ConfigError(f"{name}: split must be one of {sorted(spec.splits)}, got {split!r}")
    if limit is not None and (int(limit) != limit or limit < 0):
        raise ConfigError(f"limit must be a non-negative integer, got {limit!r}")
    folder = locate(name, data_dir, download=download, mirrors=mirrors, checksums=checksums, timeout=timeout)
    return read_split(name, folder, split, limit=limit, flatten=flatten, labels=labels, dtype=dtype,
                      checksums=checksums)


def read_split(name: str, folder, split: str = "train", *, limit: Optional[int] = None, flatten: bool = True,
               labels: str = "fine", dtype=np.float32,
               checksums: Optional[Mapping[str, str]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Read and verify one split from ``folder`` (as returned by :func:`locate`); see :func:`load`."""
    spec = _spec(name)
    folder = Path(folder)
    sums = _checksums(spec, checksums)
    if spec.kind == "idx":
        if labels != "fine":
            raise ConfigError(f"{name} has one kind of labels; labels={labels!r} applies to cifar100")
        images, y = _read_idx_split(spec, folder, split, sums)
    else:
        images, y = _read_cifar_split(spec, folder, split, labels, sums, limit)
    if limit is not None:
        images, y = images[:limit], y[:limit]
    x = images.astype(dtype) / np.asarray(255, dtype)
    if flatten:
        x = x.reshape(len(x), -1)
    return x, y.astype(np.int32)


# --------------------------------------------------------------------------- status and verification

#: the size of each dataset as its mirrors serve it (bytes; the MNIST-like ``.gz`` files, the CIFAR archive)
DOWNLOAD_BYTES = {"mnist": 9912422 + 28881 + 1648877 + 4542,
                  "fashion_mnist": 26421880 + 29515 + 4422102 + 5148,
                  "cifar10": 170498071, "cifar100": 169001437}


@dataclass(frozen=True)
class DatasetStatus:
    """Where dataset ``name`` is on this machine: ``found`` (the folder :func:`locate` would use, or
    None), ``target`` (where a download goes), ``bytes_on_disk`` (its files there), ``download_bytes``
    (what a download fetches), ``partial_bytes`` (bytes of a broken resumable download kept in
    ``target``) and ``checksums`` (``"pinned"``, or ``"$GROWMEM_DATA_CHECKSUMS"`` when overridden)."""
    name: str
    found: Optional[Path]
    target: Path
    bytes_on_disk: int
    download_bytes: int
    partial_bytes: int
    checksums: str


def _data_files(spec: DatasetSpec, folder: Path) -> List[Path]:
    if spec.kind == "idx":
        return [p for p in (_idx_path(folder, f) for f in spec.files) if p is not None]
    return [folder / spec.folder / m for m in spec.members if (folder / spec.folder / m).is_file()]


def status(name: str, data_dir=None) -> DatasetStatus:
    """Where ``name`` is (no network, no verification; see :func:`verify`)."""
    spec = _spec(name)
    if data_dir is not None:
        _explicit_dir(name, data_dir)
    found = next((d for d in search_dirs(name, data_dir) if not _missing(spec, d)), None)
    target = cache_dir(name, data_dir)
    parts = list(target.glob(".*.part")) if target.is_dir() else []
    return DatasetStatus(name=name, found=found, target=target,
                         bytes_on_disk=sum(p.stat().st_size for p in _data_files(spec, found)) if found else 0,
                         download_bytes=DOWNLOAD_BYTES[name], partial_bytes=sum(p.stat().st_size for p in parts),
                         checksums="$" + CHECKSUMS_ENV if env_checksums(name) else "pinned")


def verify(name: str, data_dir=None) -> List[Tuple[Path, Optional[str]]]:
    """Check every file of ``name`` where :func:`status` finds it against its checksum: a list of
    ``(path, None)`` for a good file, ``(path, reason)`` for a damaged one. Raises
    :class:`DatasetNotFoundError` (naming ``growmem data download``) when it is not on this machine."""
    spec = _spec(name)
    st = status(name, data_dir)
    if st.found is None:
        raise _not_found(spec, search_dirs(name, data_dir), st.target, [], spec.mirrors, False)
    sums = _checksums(spec, None)
    out: List[Tuple[Path, Optional[str]]] = []
    keys = spec.files if spec.kind == "idx" else spec.members
    for key, path in zip(keys, _data_files(spec, st.found)):
        try:
            _verifier(spec, key, sums)(path) if spec.kind == "idx" else \
                _check(spec, path, key, _file_digest(path, sums[key]), sums[key])
            out.append((path, None))
        except CorruptDatasetError as e:
            out.append((path, str(e).replace(f"{path}: ", "").replace(f" {_FIX}", "")))
    return out
