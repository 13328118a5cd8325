"""Generated datasets in the real on-disk formats, so that the loaders, streams, benchmarks and CLI run in
the tests without the real files.

- :func:`write_mnist`: the four gzipped IDX files of MNIST (uint8 28×28 images, uint8 labels), a
  learnable toy problem: each class is a smooth random stroke pattern, each image that pattern shifted by
  up to two pixels, scaled and noised.
- :func:`write_cifar`: CIFAR-10 / CIFAR-100 python pickles (``data_batch_1..5``, ``test_batch``,
  ``batches.meta`` / ``train``, ``test``, ``meta``) in the authors' channel-first layout, with the same
  kind of class patterns in colour.

Each returns the checksums of what it wrote, in the form ``$GROWMEM_DATA_CHECKSUMS`` takes
(``{file: hex digest}``): the loaders then verify the generated files exactly as they verify real ones.
"""
from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path
from typing import Dict

import numpy as np

MNIST_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
               "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def idx_bytes(a: np.ndarray) -> bytes:
    """An IDX file's bytes: two zero bytes, the type code (0x08 = uint8), the rank, big-endian sizes, data."""
    a = np.ascontiguousarray(a, np.uint8)
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def _patterns(rng, n_classes: int, side: int, channels: int) -> np.ndarray:
    """(n_classes, side, side, channels) smooth random patterns in [0, 1], one per class."""
    low = rng.random((n_classes, 7, 7, channels))
    up = np.kron(low, np.ones((1, side // 7 + 1, side // 7 + 1, 1)))[:, :side, :side]
    kernel = np.ones(3) / 3  # a little blur, then a threshold: stroke-like blobs
    for axis in (1, 2):
        up = np.apply_along_axis(lambda r: np.convolve(r, kernel, "same"), axis, up)
    return np.clip((up - 0.45) * 3.0, 0.0, 1.0)


def _images(rng, patterns: np.ndarray, labels: np.ndarray, max_shift: int = 2) -> np.ndarray:
    side = patterns.shape[1]
    out = np.empty((len(labels),) + patterns.shape[1:], np.uint8)
    for i, c in enumerate(labels):
        dy, dx = rng.integers(-max_shift, max_shift + 1, 2)
        img = np.roll(patterns[c], (dy, dx), axis=(0, 1)) * rng.uniform(0.7, 1.0)
        img = img + rng.normal(0, 0.08, img.shape)
        out[i] = np.clip(img * 255, 0, 255).astype(np.uint8)
    assert out.shape[1] == side
    return out


def _labels(rng, n: int, n_classes: int) -> np.ndarray:
    return rng.permutation(np.arange(n) % n_classes).astype(np.uint8)   # every class, evenly


def write_mnist(folder, n_train: int = 1000, n_test: int = 500, seed: int = 0) -> Dict[str, str]:
    """Write MNIST-format gzipped IDX files into ``folder``; returns ``{file: sha256 of its decompressed
    content}`` (how growmem pins MNIST)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pats = _patterns(rng, 10, 28, 1)[..., 0]
    sums = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = _labels(rng, n, 10)
        x = _images(rng, pats, y)
        for fname, arr in zip(MNIST_FILES[split], (x, y)):
            raw = idx_bytes(arr)
            (folder / fname).write_bytes(gzip.compress(raw, mtime=0))
            sums[fname] = hashlib.sha256(raw).hexdigest()
    return sums


def write_cifar(folder, name: str = "cifar10", n_per_batch: int = 40, n_test: int = 40,
                seed: int = 0) -> Dict[str, str]:
    """Write CIFAR-format pickles into ``folder/<archive folder>/``; returns ``{member: md5}`` (how growmem
    pins CIFAR's pickles). ``name``: ``cifar10`` (5 training batches) or ``cifar100`` (one ``train``)."""
    rng = np.random.default_rng(seed)
    if name == "cifar10":
        sub, n_classes, key = "cifar-10-batches-py", 10, b"labels"
        members = {f"data_batch_{i}": n_per_batch for i in range(1, 6)}
        members["test_batch"] = n_test
        meta = ("batches.meta", {b"label_names": [f"class{i}".encode() for i in range(10)]})
    elif name == "cifar100":
        sub, n_classes, key = "cifar-100-python", 100, b"fine_labels"
        members = {"train": 5 * n_per_batch, "test": n_test}
        meta = ("meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                         b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    else:
        raise ValueError(f"name must be cifar10 or cifar100, got {name!r}")
    out = Path(folder) / sub
    out.mkdir(parents=True, exist_ok=True)
    pats = _patterns(rng, n_classes, 32, 3)
    sums = {}
    for member, n in members.items():
        y = rng.integers(0, n_classes, n)
        x = _images(rng, pats, y).transpose(0, 3, 1, 2).reshape(n, 3072)   # channel-first rows, as the authors'
        d = {b"data": x, key: [int(v) for v in y]}
        if name == "cifar100":
            d[b"coarse_labels"] = [int(v) % 20 for v in y]
        body = pickle.dumps(d, protocol=2)
        (out / member).write_bytes(body)
        sums[member] = hashlib.md5(body).hexdigest()
    body = pickle.dumps(meta[1], protocol=2)
    (out / meta[0]).write_bytes(body)
    sums[meta[0]] = hashlib.md5(body).hexdigest()
    return sums
