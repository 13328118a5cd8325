"""growmem: continual learning with growing memories (retrieval-centric deep learning in JAX)."""
from . import kernels, memory, rules
from .layers import (GrowingLayer, GrowingSpec, ParametricSoftmax, ResidualGrowingNet, ResidualMLP,
                     TeacherMLP, ViT, rms_norm)
from .memory import Memory
from .train import Trainer, TrainState, cross_entropy, squared_error

__version__ = "0.1.0"
__all__ = ["kernels", "memory", "rules", "GrowingLayer", "GrowingSpec", "ParametricSoftmax",
           "ResidualGrowingNet", "ResidualMLP", "TeacherMLP", "ViT", "rms_norm", "Memory", "Trainer",
           "TrainState", "cross_entropy", "squared_error", "__version__"]
