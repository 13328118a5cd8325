"""MNIST: the entry points older code uses, on top of :mod:`growmem.data.datasets`.

Where the four gzipped IDX files are looked for (:func:`candidate_dirs`): an explicit ``data_dir``
(``data_dir/mnist/`` or ``data_dir`` itself; a ``data_dir`` that does not exist is an error), else
``$GROWMEM_DATA/mnist/`` or ``$GROWMEM_DATA``, then ``${XDG_CACHE_HOME:-~/.cache}/growmem/mnist/``.
Every load verifies the files' content against pinned SHA-256 checksums.

:func:`load` never downloads unless ``download=True``; ``growmem.data.load("mnist", ...)`` downloads
on first use. :func:`download` fetches the files into a given folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from . import datasets as _ds
from .datasets import CorruptDatasetError, DatasetNotFoundError, read_idx  # noqa: F401  (public names)

FILES = {split: tuple(files) for split, files in _ds.DATASETS["mnist"].splits.items()}
#: public mirrors of the original files (the original site no longer serves them reliably)
MIRRORS = _ds.DATASETS["mnist"].mirrors


def candidate_dirs(data_dir=None) -> List[Path]:
    """The folders searched for the MNIST files, in order."""
    return _ds.search_dirs("mnist", data_dir)


def find(data_dir=None) -> Path:
    """The first folder holding all four MNIST files; a :class:`DatasetNotFoundError` (a
    FileNotFoundError) naming the folders searched and how to get the files if there is none."""
    spec = _ds.DATASETS["mnist"]
    if data_dir is not None:
        _ds._explicit_dir("mnist", data_dir)
    searched = candidate_dirs(data_dir)
    for d in searched:
        if not _ds._missing(spec, d):
            return d
    raise _ds._not_found(spec, searched, _ds.cache_dir("mnist", data_dir), [], MIRRORS, False)


def available(data_dir=None) -> bool:
    """Whether :func:`find` would find the four MNIST files (no network)."""
    try:
        find(data_dir)
        return True
    except FileNotFoundError:
        return False


def load(split: str = "train", data_dir=None, *, limit: Optional[int] = None, flatten: bool = True,
         dtype=np.float32, download: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one split: ``x`` pixels in [0, 1] ``(n, 784)`` (or ``(n, 28, 28)``), ``y`` int32.

    With ``download=True`` missing files are fetched into ``growmem.data.cache_dir("mnist", data_dir)``."""
    if split not in FILES:
        raise ConfigError(f"split must be one of {sorted(FILES)}, got {split!r}")
    try:
        d = find(data_dir)
    except DatasetNotFoundError:
        if not download:
            raise
        d = _ds.locate("mnist", data_dir, download=True)
    return _ds.read_split("mnist", d, split, limit=limit, flatten=flatten, dtype=dtype)


def download(directory, mirrors: Sequence[str] = MIRRORS) -> Path:
    """Download the four gzipped IDX files into ``directory`` (files already there are kept), each
    verified before it is kept; a :class:`DatasetNotFoundError` listing every URL tried if one fails."""
    return _ds.download("mnist", directory, mirrors=mirrors)
