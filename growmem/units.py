"""Sizes written by people: ``512MB``, ``1.5GiB``, ``4096`` (the bottom floor: no growmem imports)."""
from __future__ import annotations

#: SI units for kB/MB/GB/TB (1 MB = 10^6 B, as memory budgets are quoted: Replay-4400 on MNIST is
#: "15.7 MB" = 15.7e6 B) and IEC units for KiB/MiB/GiB/TiB (1 MiB = 2^20 B)
_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "kib": 1 << 10, "m": 10 ** 6, "mb": 10 ** 6, "mib": 1 << 20,
          "g": 10 ** 9, "gb": 10 ** 9, "gib": 1 << 30, "t": 10 ** 12, "tb": 10 ** 12, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"512MB"``, ``"1.5GiB"``, ``"4096"`` -> bytes (1 MB = 10^6 B, 1 MiB = 2^20 B)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 512MB, 1.5GB or 4096 (bytes)")
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not n < 2 ** 63:            # a 400-digit number is inf: int() of it raised OverflowError
        raise ValueError(f"size {text!r} is too large: at most {2 ** 63 - 1} bytes")
    return int(n)
