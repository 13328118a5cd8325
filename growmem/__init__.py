"""growmem: continual learning with growing memories (retrieval-centric deep learning in JAX).

The names below are imported on first use (``growmem.Trainer``, ``from growmem import kernels``),
so that ``import growmem`` — and a ``growmem`` command line that is refused — does not wait for
JAX to load."""
import importlib

from .version import __version__
#: public name -> the module that defines it
_NAMES = {"GrowingLayer": "layers", "GrowingSpec": "layers", "ParametricSoftmax": "layers",
          "ResidualGrowingNet": "layers", "ResidualMLP": "layers", "TeacherMLP": "layers", "ViT": "layers",
          "rms_norm": "layers", "Memory": "memory", "Trainer": "train", "TrainState": "train",
          "cross_entropy": "train", "squared_error": "train"}
_MODULES = ("kernels", "memory", "rules")
__all__ = [*_MODULES, *_NAMES, "__version__"]


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _NAMES:
        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'growmem' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
