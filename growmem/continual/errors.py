"""Errors of :mod:`growmem.continual`, and the lazy import of the ``continual`` extra.

Every error names the problem and the fix. Avalanche (and PyTorch) are imported only when a
function of this package needs them, so ``import growmem`` and ``import growmem.continual``
work without the extra.
"""
from __future__ import annotations

from typing import Iterable

from growmem.data.datasets import DatasetNotFoundError  # noqa: F401  (one class for a missing dataset)
from growmem.errors import ConfigError, GrowmemError, WrongTypeError  # noqa: F401  (re-exported)

#: how to install what this package needs
EXTRA_INSTALL = "pip install 'growmem[continual]'"


class MissingExtraError(GrowmemError, ImportError):
    """``avalanche-lib`` (or PyTorch) is not installed."""


class UnknownNameError(GrowmemError, ValueError):
    """An unknown stream, preset, baseline or method name; the message lists the valid ones."""


class InputShapeError(GrowmemError, ValueError):
    """A stream's inputs do not fit the model; the message names both shapes."""


def require_avalanche():
    """Import and return the ``avalanche`` package, or raise :class:`MissingExtraError`."""
    try:
        import torch  # noqa: F401
        import avalanche
    except ImportError as e:
        raise MissingExtraError(
            f"growmem.continual needs avalanche-lib and PyTorch, which are not installed ({e}). "
            f"Install the extra: {EXTRA_INSTALL}") from e
    return avalanche


def unknown(kind: str, name, valid: Iterable[str], hint: str = "") -> UnknownNameError:
    """``UnknownNameError`` for ``name`` listing the valid names of ``kind``."""
    valid = list(valid)
    return UnknownNameError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(valid)}" + (f" ({hint})" if hint else ""))
