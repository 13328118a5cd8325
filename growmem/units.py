"""Sizes written by people (``512MB``, ``1.5GiB``, ``4096``) and the one rule for each quantity every entry
point takes — a memory budget, a kernel temperature — so the API, the presets and the commands refuse the same
values with the same words (the bottom floor: only :mod:`growmem.errors`)."""
from __future__ import annotations

import math
from typing import Optional

from .errors import ConfigError

#: the smallest kernel temperature T: below it the scores q·k/T overflow float32
MIN_TEMPERATURE = 1e-6

#: SI units for kB/MB/GB/TB (1 MB = 10^6 B, as memory budgets are quoted: Replay-4400 on MNIST is
#: "15.7 MB" = 15.7e6 B) and IEC units for KiB/MiB/GiB/TiB (1 MiB = 2^20 B)
_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "kib": 1 << 10, "m": 10 ** 6, "mb": 10 ** 6, "mib": 1 << 20,
          "g": 10 ** 9, "gb": 10 ** 9, "gib": 1 << 30, "t": 10 ** 12, "tb": 10 ** 12, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"512MB"``, ``"1.5GiB"``, ``"4096"`` -> bytes (1 MB = 10^6 B, 1 MiB = 2^20 B)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read {text!r} as a size: write e.g. 512MB, 1.5GB or 4096 (bytes)")
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not n < 2 ** 63:            # a 400-digit number is inf: int() of it raised OverflowError
        raise ConfigError(f"size {text!r} is too large: at most {2 ** 63 - 1} bytes")
    return int(n)


def byte_budget(value, what: str = "budget_bytes") -> Optional[int]:
    """A memory budget in bytes: None (no budget), a positive integer, or a size as people write it
    (``"15.7MB"``, :func:`parse_size`); anything else is a :class:`~growmem.errors.ConfigError` naming
    ``what``."""
    if value is None:
        return None
    n = value
    if isinstance(value, str):
        try:
            n = parse_size(value)
        except ValueError as e:
            raise ConfigError(f"{what}: {e}") from None
    try:     # int, numpy integers, integral floats; not bool, NaN, inf, 1.5 or a list
        ok = not isinstance(n, bool) and int(n) == n and int(n) > 0
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"{what} must be a positive number of bytes (or a size such as 15.7MB), got {value!r}")
    return int(n)


def check_temperature(value, what: str = "temperature") -> float:
    """A kernel temperature T: a finite number >= :data:`MIN_TEMPERATURE`; else a
    :class:`~growmem.errors.ConfigError` naming ``what``."""
    try:
        ok = not isinstance(value, bool) and math.isfinite(float(value)) and float(value) >= MIN_TEMPERATURE
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"{what} must be a finite number >= {MIN_TEMPERATURE} (smaller ones overflow float32 "
                          f"scores), got {value!r}")
    return float(value)
