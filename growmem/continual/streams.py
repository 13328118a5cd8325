"""Continual-learning streams, built by Avalanche's own benchmark generators.

=================  ==========================================================================
``split_mnist``     5 experiences x 2 classes, class-incremental (``nc_benchmark``, as
                    ``avalanche.benchmarks.SplitMNIST``)
``permuted_mnist``  10 experiences, each a fixed pixel permutation of all of MNIST,
                    domain-incremental (Avalanche's ``PixelsPermutation`` as a frozen transform,
                    ``nc_benchmark(one_dataset_per_exp=True)``, as ``PermutedMNIST``)
``rotated_mnist``   10 experiences, each a fixed rotation (torchvision ``RandomRotation`` with
                    one angle, as ``RotatedMNIST``), domain-incremental
``split_cifar10``   Avalanche's ``SplitCIFAR10`` (5 x 2 classes); needs the CIFAR files
``split_cifar100``  Avalanche's ``SplitCIFAR100`` (10 x 10 classes); needs the CIFAR files
``drifting_teacher`` embedded, generated (no download): see :mod:`growmem.continual.drifting`
=================  ==========================================================================

Offline, the MNIST family is built from the local IDX files read by
``growmem.data.mnist.load(split, data_dir)`` and then goes through the same Avalanche calls as
Avalanche's classic generators (same class order / permutations / angles for the same seed, the
same ``Normalize((0.1307,), (0.3081,))`` train and eval transforms), so a stream built here
equals Avalanche's own ``SplitMNIST(5, seed=s)`` etc. on the same files. With ``download=True``
Avalanche's own classes are called instead and fetch the data themselves (network).

:func:`make_stream` also takes **any Avalanche benchmark object** (anything with a
``train_stream`` and a ``test_stream`` of classification experiences) and describes it.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .errors import ConfigError, DatasetNotFoundError, WrongTypeError, require_avalanche, unknown

require_avalanche()

import torch  # noqa: E402

from .stream_names import MNIST_FAMILY, STREAMS  # noqa: E402,F401  (the names, importable without torch)
DEFAULT_EXPERIENCES = {"split_mnist": 5, "permuted_mnist": 10, "rotated_mnist": 10, "split_cifar10": 5,
                       "split_cifar100": 10}
#: torchvision's folder for each CIFAR (under the dataset root)
_CIFAR_DIRS = {"split_cifar10": ("cifar10", "cifar-10-batches-py"), "split_cifar100": ("cifar100", "cifar-100-python")}


@dataclasses.dataclass
class Stream:
    """An Avalanche benchmark plus what the runner needs to know about it."""

    name: str
    benchmark: Any
    n_classes: int
    input_shape: Tuple[int, ...]
    n_experiences: int
    #: distinct task labels of the training experiences (``(0,)`` unless task-incremental)
    task_labels: Tuple[int, ...] = (0,)
    scenario: str = "class-incremental"
    #: extra keyword arguments for ``strategy.train(exp, **train_kwargs)`` (e.g. ``shuffle=False``)
    train_kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def input_size(self) -> int:
        return int(math.prod(self.input_shape))

    @property
    def train_stream(self):
        return self.benchmark.train_stream

    @property
    def test_stream(self):
        return self.benchmark.test_stream

    @property
    def task_incremental(self) -> bool:
        return len(self.task_labels) > 1

    @property
    def fixed_train_transforms(self) -> bool:
        """Whether a training sample reads as the same tensor every time: the MNIST family's transforms and the
        drifting stream's tensors are fixed; CIFAR's training transforms augment, a user's benchmark is unknown."""
        return self.name in MNIST_FAMILY or self.name == "drifting_teacher"


class ArrayDataset(torch.utils.data.Dataset):
    """Images ``(n, *shape)`` float32 in [0, 1] with integer ``targets``; an item is ``(tensor,
    int)``, like Avalanche's ``TensorMNIST`` (what its ``get_mnist_dataset`` returns)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, shape: Tuple[int, ...], name: str = ""):
        x = np.asarray(x, np.float32).reshape((len(x),) + tuple(shape))
        self.data = torch.from_numpy(np.ascontiguousarray(x))
        self.targets = torch.from_numpy(np.asarray(y, np.int64))
        self.name = name

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.data[i], int(self.targets[i])

    def __repr__(self):
        return f"ArrayDataset({self.name!r}, n={len(self)}, shape={tuple(self.data.shape[1:])})"


# ----------------------------------------------------------------------------- MNIST family

def _mnist_transforms():
    """Avalanche's default MNIST train/eval transforms (``Normalize((0.1307,), (0.3081,))``)."""
    try:
        from avalanche.benchmarks.classic.cmnist import _default_mnist_eval_transform as ev
        from avalanche.benchmarks.classic.cmnist import _default_mnist_train_transform as tr
        return tr, ev
    except ImportError:  # a future Avalanche without the private names: the same values
        from torchvision.transforms import Compose, Normalize
        return Compose([Normalize((0.1307,), (0.3081,))]), Compose([Normalize((0.1307,), (0.3081,))])


def _how_to_get_mnist() -> str:
    return ("Get the four MNIST IDX files with `growmem data download mnist` (or `growmem data download mnist --dir "
            "DIR` and pass --data-dir DIR / set GROWMEM_DATA=DIR); or pass --download (download=True) to let "
            "Avalanche download MNIST itself (needs a network)")


#: the held-out share of the training data in a ``split="validation"`` stream
VALIDATION_FRACTION = 0.1
SPLITS = ("test", "validation")


def validation_indices(y, seed: int, fraction: float = VALIDATION_FRACTION) -> Tuple[np.ndarray, np.ndarray]:
    """``(train_idx, val_idx)``: ``fraction`` of each class's training samples held out (at least one per
    class), chosen by ``seed`` alone, so every method and every tuning run sees the same split."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"the validation fraction must be in (0, 1), got {fraction}")
    y = np.asarray(y).reshape(-1)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x76616C]))
    val = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        val.append(rng.choice(idx, size=max(1, int(round(fraction * len(idx)))), replace=False))
    val = np.sort(np.concatenate(val)) if val else np.zeros(0, np.int64)
    keep = np.ones(len(y), bool)
    keep[val] = False
    return np.flatnonzero(keep), val


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise unknown("split", split, SPLITS)
    return split


def mnist_arrays(data_dir=None, train_limit=None, test_limit=None, split: str = "test", seed: int = 0):
    """``((x_train, y_train), (x_eval, y_eval))`` from ``growmem.data.mnist.load`` (x float32
    ``(n, 784)`` in [0, 1]); a missing dataset raises :class:`DatasetNotFoundError`.

    ``split="test"``: all the training images and the test images. ``split="validation"``: the
    training images without a held-out ``VALIDATION_FRACTION`` of each class
    (:func:`validation_indices`, fixed by ``seed``), and that held-out part in place of the test
    images (which are then never read)."""
    check_split(split)
    from growmem.data import mnist

    try:
        xtr, ytr = mnist.load("train", data_dir)
        xte, yte = mnist.load("test", data_dir) if split == "test" else (None, None)
    except FileNotFoundError as e:
        searched = ""
        if hasattr(mnist, "candidate_dirs"):
            try:
                searched = "\nFolders searched: " + ", ".join(str(p) for p in mnist.candidate_dirs(data_dir))
            except Exception:  # the data module may refuse a bad data_dir here too
                searched = ""
        raise DatasetNotFoundError(f"the MNIST streams need the MNIST files: {e}{searched}\n{_how_to_get_mnist()}") \
            from None
    if train_limit is not None:
        xtr, ytr = xtr[:int(train_limit)], ytr[:int(train_limit)]
    if split == "validation":
        keep, val = validation_indices(ytr, seed)
        (xtr, ytr), (xte, yte) = (xtr[keep], ytr[keep]), (xtr[val], ytr[val])
    if test_limit is not None:
        xte, yte = xte[:int(test_limit)], yte[:int(test_limit)]
    return (np.asarray(xtr, np.float32), np.asarray(ytr)), (np.asarray(xte, np.float32), np.asarray(yte))


def _frozen(dataset, transform):
    """``dataset`` as an Avalanche classification dataset with ``transform`` frozen in (how
    Avalanche's ``PermutedMNIST``/``RotatedMNIST`` attach their permutation / rotation)."""
    from avalanche.benchmarks.utils import DefaultTransformGroups, _make_taskaware_classification_dataset
    from avalanche.benchmarks.utils.data import make_avalanche_dataset

    return make_avalanche_dataset(_make_taskaware_classification_dataset(dataset),
                                  frozen_transform_groups=DefaultTransformGroups((transform, None)))


def _rotated(dataset: ArrayDataset, rotation) -> ArrayDataset:
    """``dataset`` with every image rotated by ``rotation`` (a torchvision ``RandomRotation`` of one angle),
    applied once to the whole ``(n, 1, 28, 28)`` tensor: each image gets the values the transform gives it
    alone."""
    out = ArrayDataset.__new__(ArrayDataset)
    out.data, out.targets, out.name = rotation(dataset.data).contiguous(), dataset.targets, dataset.name
    return out


def _mnist_family(name, *, seed, n_experiences, task_labels, data_dir, download, train_limit, test_limit,
                  split="test"):
    from avalanche.benchmarks import nc_benchmark

    n = n_experiences or DEFAULT_EXPERIENCES[name]
    info = {"source": "avalanche download" if download else "local IDX files", "seed": seed, "split": split}
    if download:
        if train_limit is not None or test_limit is not None or split != "test":
            raise ConfigError(f"{name}: train_limit/test_limit and split='validation' apply to the offline streams "
                              f"only (download=False)")
        from avalanche.benchmarks.classic import PermutedMNIST, RotatedMNIST, SplitMNIST
        cls = {"split_mnist": SplitMNIST, "permuted_mnist": PermutedMNIST, "rotated_mnist": RotatedMNIST}[name]
        bm = cls(n, return_task_id=task_labels, seed=seed, dataset_root=data_dir)
    else:
        (xtr, ytr), (xte, yte) = mnist_arrays(data_dir, train_limit, test_limit, split, seed)
        train = ArrayDataset(xtr, ytr, (1, 28, 28), "mnist-train")
        test = ArrayDataset(xte, yte, (1, 28, 28), "mnist-test" if split == "test" else "mnist-validation")
        tr_t, ev_t = _mnist_transforms()
        if name == "split_mnist":
            for part, y, flag, limit in (("training", ytr, "train_limit", train_limit),
                                         ("test", yte, "test_limit", test_limit)):
                missing = sorted(set(range(10)) - set(np.unique(np.asarray(y)).tolist()))
                if missing:   # Avalanche's class split needs every class on both sides (else a KeyError)
                    raise ConfigError(f"{name}: the {len(y)} {part} images ({flag}={limit}) hold no image of "
                                      f"class {', '.join(map(str, missing))}; every class must appear: raise "
                                      f"{flag} (--{flag.replace('_', '-')})")
            # the calls of avalanche.benchmarks.classic.SplitMNIST (defaults: shuffle=True)
            bm = nc_benchmark(train_dataset=train, test_dataset=test, n_experiences=n, task_labels=task_labels,
                              seed=seed, shuffle=True, train_transform=tr_t, eval_transform=ev_t)
        else:
            trains, tests = [], []
            if name == "permuted_mnist":
                from avalanche.benchmarks.classic.cmnist import PixelsPermutation
                rng = np.random.RandomState(seed)  # as PermutedMNIST: one permutation per experience
                perms = []
                for _ in range(n):
                    idx = torch.from_numpy(rng.permutation(784)).type(torch.int64)
                    perms.append(idx)
                    t = PixelsPermutation(idx)
                    trains.append(_frozen(train, t))
                    tests.append(_frozen(test, t))
                info["permutation_seed"] = seed
            else:
                from torchvision.transforms import RandomRotation
                rng = np.random.RandomState(seed)  # as RotatedMNIST: one angle per experience
                angles = []
                for _ in range(n):
                    a = int(rng.randint(-180, 181))
                    angles.append(a)
                    t = RandomRotation(degrees=(a, a))
                    # rotated once per experience, the whole tensor at a time (the same values as the frozen
                    # per-sample transform, tested; rotating every item at every access made this stream ~5x
                    # slower than the permuted one)
                    trains.append(_frozen(_rotated(train, t), None))
                    tests.append(_frozen(_rotated(test, t), None))
                info["angles"] = angles
            bm = nc_benchmark(trains, tests, n_experiences=len(trains), task_labels=task_labels, shuffle=False,
                              class_ids_from_zero_in_each_exp=True, one_dataset_per_exp=True,
                              train_transform=tr_t, eval_transform=ev_t)
    if name == "split_mnist":
        info["classes_order"] = [int(c) for c in bm.classes_order]
    scenario = "task-incremental" if task_labels else (
        "class-incremental" if name == "split_mnist" else "domain-incremental")
    return Stream(name, bm, 10, (1, 28, 28), n, tuple(range(n)) if task_labels else (0,), scenario, {}, info)


# ----------------------------------------------------------------------------- CIFAR

def _cifar_roots(name, data_dir) -> List[Path]:
    sub, _ = _CIFAR_DIRS[name]
    out = []
    if data_dir:
        out += [Path(data_dir), Path(data_dir) / sub]
    env = os.environ.get("GROWMEM_DATA")
    if env:
        out += [Path(env) / sub, Path(env)]
    from avalanche.benchmarks.datasets.dataset_utils import default_dataset_location
    out.append(Path(default_dataset_location(sub)))
    return out


def _cifar(name, *, seed, n_experiences, task_labels, data_dir, download, train_limit, test_limit, split="test"):
    if split != "test":
        raise ConfigError(f"{name}: split='validation' is implemented for the MNIST family and drifting_teacher")
    if train_limit is not None or test_limit is not None:
        raise ConfigError(f"{name}: train_limit/test_limit apply to the MNIST family and drifting_teacher only")
    _, folder = _CIFAR_DIRS[name]
    roots = _cifar_roots(name, data_dir)
    root = next((r for r in roots if (r / folder).is_dir()), None)
    if root is None and not download:
        raise DatasetNotFoundError(
            f"{name} needs the {'CIFAR-10' if name == 'split_cifar10' else 'CIFAR-100'} files (torchvision layout: "
            f"ROOT/{folder}/). Searched ROOT in:\n  " + "\n  ".join(str(r) for r in roots)
            + f"\nGet them by passing --download (download=True: Avalanche/torchvision fetch them into {roots[0]}, "
              f"needs a network), or unpack the python version of the dataset into one of these folders "
              f"and pass --data-dir ROOT (or set GROWMEM_DATA)")
    root = root or roots[0]
    from avalanche.benchmarks.classic import SplitCIFAR10, SplitCIFAR100
    cls = SplitCIFAR10 if name == "split_cifar10" else SplitCIFAR100
    n = n_experiences or DEFAULT_EXPERIENCES[name]
    bm = cls(n, return_task_id=task_labels, seed=seed, dataset_root=str(root))
    return Stream(name, bm, 10 if name == "split_cifar10" else 100, (3, 32, 32), n,
                  tuple(range(n)) if task_labels else (0,), "task-incremental" if task_labels else "class-incremental",
                  {}, {"root": str(root), "seed": seed, "classes_order": [int(c) for c in bm.classes_order]})


# ----------------------------------------------------------------------------- drifting teacher

def _drifting(*, seed, n_experiences, task_labels, data_dir, download, train_limit, test_limit, split="test",
              **options):
    from .drifting import DriftingTeacher

    if task_labels:
        raise ConfigError("drifting_teacher has no task labels (the point is that nobody announces the change)")
    kw = dict(options)
    if n_experiences:
        kw["n_experiences"] = n_experiences
    if train_limit is not None:
        kw["samples_per_experience"] = int(train_limit)
    if test_limit is not None:
        kw["test_samples"] = int(test_limit)
    try:
        dt = DriftingTeacher(seed=seed, **kw)
    except TypeError as e:
        valid = [f.name for f in dataclasses.fields(DriftingTeacher) if f.name != "seed"]
        raise ConfigError(f"drifting_teacher: {e}; its options are {', '.join(valid)}") from None
    return Stream("drifting_teacher", dt.benchmark(split), dt.n_classes, (dt.d,), dt.n_experiences, (0,), "drift",
                  {"shuffle": False}, {"settings": dataclasses.asdict(dt), "split": split})


# ----------------------------------------------------------------------------- any benchmark

def describe_benchmark(benchmark, name: str = "user") -> Stream:
    """A :class:`Stream` for any Avalanche benchmark object (``train_stream`` + ``test_stream``)."""
    if not (hasattr(benchmark, "train_stream") and hasattr(benchmark, "test_stream")):
        raise WrongTypeError(f"expected a stream name ({', '.join(STREAMS)}) or an Avalanche benchmark object with "
                             f"train_stream and test_stream, got {type(benchmark).__name__}")
    train = list(benchmark.train_stream)
    if not train:
        raise ConfigError("the benchmark's train_stream has no experiences")
    n_classes = getattr(benchmark, "n_classes", None)
    if not isinstance(n_classes, int):
        labels = set()
        for exp in list(train) + list(benchmark.test_stream):
            labels |= {int(c) for c in exp.dataset.targets.uniques}
        n_classes = max(labels) + 1
    x0 = train[0].dataset[0][0]
    shape = tuple(int(s) for s in getattr(x0, "shape", np.shape(x0)))
    tasks = sorted({int(t) for exp in train for t in getattr(exp, "task_labels", [0])})
    return Stream(name, benchmark, int(n_classes), shape, len(train), tuple(tasks),
                  "task-incremental" if len(tasks) > 1 else "user", {}, {"benchmark": type(benchmark).__name__})


_BUILDERS = {**{n: _mnist_family for n in MNIST_FAMILY}, "split_cifar10": _cifar, "split_cifar100": _cifar,
             "drifting_teacher": _drifting}


def make_stream(stream, *, seed: int = 0, data_dir=None, download: bool = False, n_experiences: Optional[int] = None,
                task_labels: bool = False, train_limit: Optional[int] = None, test_limit: Optional[int] = None,
                split: str = "test", **options) -> Stream:
    """Build a stream by name (see :data:`STREAMS`) or describe an Avalanche benchmark object.

    ``seed`` fixes the class order (split), the permutations / angles (permuted, rotated) or the
    teachers and samples (drifting). ``task_labels=True`` gives each experience its task label
    (task-incremental). ``train_limit`` / ``test_limit`` keep the first samples of each split
    (MNIST family) or set the samples per experience (drifting). ``split="validation"`` evaluates on
    held-out training data instead of the test data, for choosing hyperparameters: the MNIST
    family holds out ``VALIDATION_FRACTION`` of each class's training images (and trains on the
    rest), the drifting stream draws its evaluation samples afresh (same teachers, never the test
    samples). ``options`` go to the drifting teacher (``d``, ``n_classes``, ``hidden``, ``change``,
    ``drift``).
    """
    check_split(split)
    if not isinstance(stream, str):
        if any(v is not None for v in (n_experiences, train_limit, test_limit)) or options or task_labels \
                or split != "test":
            raise ConfigError("stream options apply to named streams, not to a benchmark object")
        return describe_benchmark(stream)
    if stream not in _BUILDERS:
        raise unknown("stream", stream, STREAMS)
    if options and stream != "drifting_teacher":
        raise ConfigError(f"{stream} takes no options {sorted(options)} (they are drifting_teacher settings)")
    return _BUILDERS[stream](stream, seed=seed, n_experiences=n_experiences, task_labels=task_labels,
                             data_dir=data_dir, download=download, train_limit=train_limit, test_limit=test_limit,
                             split=split, **options) if stream != "drifting_teacher" else \
        _drifting(seed=seed, n_experiences=n_experiences, task_labels=task_labels, data_dir=data_dir,
                  download=download, train_limit=train_limit, test_limit=test_limit, split=split, **options)
