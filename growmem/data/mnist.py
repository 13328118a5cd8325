"""MNIST from the standard gzipped IDX files (the four files of the original distribution).

Where the files are looked for, in order:

1. the ``data_dir`` argument (the CLI's ``--data-dir``),
2. the ``GROWMEM_DATA`` environment variable (its ``mnist/`` subfolder, or the folder itself),
3. ``../shared/data/mnist`` relative to the repository root.

:func:`download` fetches the files for users who have none (tests never call it).
"""
from __future__ import annotations

import gzip
import os
import struct
import urllib.request
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
#: public mirrors of the original files (the original site no longer serves them reliably)
MIRRORS = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)
_REPO = Path(__file__).resolve().parents[2]
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path) -> np.ndarray:
    """Read one IDX file (gzipped or not) into an array of its stored shape and type."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":  # gzip magic
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX element type 0x{code:02x}")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=_IDX_DTYPES[code], offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but holds {arr.size} elements")
    return arr.reshape(shape)


def candidate_dirs(data_dir=None) -> List[Path]:
    """The folders searched for the MNIST files, in order."""
    out = []
    if data_dir:
        out += [Path(data_dir), Path(data_dir) / "mnist"]
    env = os.environ.get("GROWMEM_DATA")
    if env:
        out += [Path(env) / "mnist", Path(env)]
    out.append(_REPO.parent / "shared" / "data" / "mnist")
    return out


def find(data_dir=None) -> Path:
    """The first folder holding all four MNIST files; a clear error if there is none."""
    searched = candidate_dirs(data_dir)
    for d in searched:
        if all((d / f).is_file() for pair in FILES.values() for f in pair):
            return d
    raise FileNotFoundError(
        "MNIST not found. Looked for the four files " + ", ".join(f for p in FILES.values() for f in p)
        + " in:\n  " + "\n  ".join(str(d) for d in searched)
        + "\nGet them with `python -c 'from growmem.data import mnist; mnist.download(\"DIR\")'` and pass "
          "--data-dir DIR (or set GROWMEM_DATA=DIR).")


def available(data_dir=None) -> bool:
    """Whether :func:`find` would find the four MNIST files."""
    try:
        find(data_dir)
        return True
    except FileNotFoundError:
        return False


def load(split: str = "train", data_dir=None, *, limit: Optional[int] = None, flatten: bool = True,
         dtype=np.float32) -> Tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one split: ``x`` pixels in [0, 1] ``(n, 784)`` (or ``(n, 28, 28)``), ``y`` int32."""
    if split not in FILES:
        raise ValueError(f"split must be one of {sorted(FILES)}, got {split!r}")
    d = find(data_dir)
    images, labels = (read_idx(d / f) for f in FILES[split])
    if len(images) != len(labels):
        raise ValueError(f"{d}: {len(images)} {split} images but {len(labels)} labels")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    x = images.astype(dtype) / 255.0
    if flatten:
        x = x.reshape(len(x), -1)
    return x, labels.astype(np.int32)


def download(directory, mirrors=MIRRORS) -> Path:
    """Download the four gzipped IDX files into ``directory`` (skips files already there)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name in (f for pair in FILES.values() for f in pair):
        target = d / name
        if target.is_file():
            continue
        errors = []
        for base in mirrors:
            try:
                tmp = d / (name + ".part")
                urllib.request.urlretrieve(base + name, tmp)
                read_idx(tmp)  # validate before keeping it
                tmp.replace(target)
                break
            except Exception as e:  # try the next mirror
                errors.append(f"{base}: {e}")
        else:
            raise RuntimeError(f"could not download {name}:\n  " + "\n  ".join(errors))
    return d
