"""Sizes written by people: ``512MB``, ``1.5GiB``, ``4096`` (the bottom floor: no growmem imports)."""
from __future__ import annotations

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"512MB"``, ``"1.5GiB"``, ``"4096"`` -> bytes (binary units: 1 MB = 2^20 B)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 512MB, 1.5GB or 4096 (bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
