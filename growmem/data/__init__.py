"""Datasets: synthetic teacher-student regression and loaders for standard image datasets.

``growmem.data.load(name, split, data_dir=None, download=True, limit=None)`` returns ``(x, y)`` for
``mnist``, ``fashion_mnist``, ``cifar10`` and ``cifar100`` (x float32 in [0, 1], y int32), finding the
files on this machine or downloading and verifying them on first use; see
:mod:`growmem.data.datasets` for where files are looked for and kept. CIFAR augmentation and
normalisation (App. F.1.1) are in :mod:`growmem.data.transforms` (imports JAX).
"""
from .datasets import (CHECKSUMS_ENV, DATASETS, CorruptDatasetError, DatasetError, DatasetNotFoundError, DatasetSpec,
                       DatasetStatus, available, cache_dir, download, load, locate, names, read_idx, read_split,
                       search_dirs, status, verify)

__all__ = ["CHECKSUMS_ENV", "DATASETS", "CorruptDatasetError", "DatasetError", "DatasetNotFoundError", "DatasetSpec",
           "DatasetStatus", "available", "cache_dir", "download", "load", "locate", "names", "read_idx", "read_split",
           "search_dirs", "status", "verify"]
