"""Result files: JSON with a top-level ``summary`` and a PNG beside it, written atomically."""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence


def _jsonable(x):
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None  # NaN / inf are not JSON
    return x


def write_json(path, payload: Dict[str, Any]) -> Path:
    """Write ``payload`` (+ environment info) to ``path`` atomically (tmp file + rename)."""
    import jax

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = dict(payload)
    payload.setdefault("environment", {
        "python": sys.version.split()[0], "jax": jax.__version__, "platform": platform.platform(),
        "devices": [str(d) for d in jax.devices()], "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_jsonable(payload), f, indent=1, allow_nan=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_figure(fig, path) -> Path:
    """Save a matplotlib figure atomically as PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)
    return path


def pyplot():
    """matplotlib.pyplot with a non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------- mean ± std, and ties

def mean_std(values: Sequence[float]) -> Dict[str, Any]:
    """``{"mean", "std", "n", "values"}``: ``std`` is the sample standard deviation (ddof = 1; 0.0 for a
    single value, which ``n == 1`` marks as unmeasured)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_std needs at least one value")
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(vals), "values": vals}


def standard_error_of_difference(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """``sqrt(s_a²/n_a + s_b²/n_b)`` (sample variances), or None when either side has fewer than two
    values (its spread is not measured)."""
    if len(a) < 2 or len(b) < 2:
        return None
    sa, sb = mean_std(a)["std"], mean_std(b)["std"]
    return math.sqrt(sa * sa / len(a) + sb * sb / len(b))


def compare(a: Sequence[float], b: Sequence[float], *, higher: bool = True, k: float = 2.0,
            paired: bool = False) -> str:
    """``"better"`` if ``a`` beats ``b`` (higher mean when ``higher``) by more than ``k`` standard errors
    of the difference, ``"worse"`` if ``b`` beats ``a`` by as much, else ``"tie"``; ``"untested"`` when a
    side has fewer than two values. ``paired``: ``a[i]`` and ``b[i]`` come from the same seed (stream,
    order, initialisation), so the standard error is that of the mean of the per-seed differences. Two
    sides without any spread are told apart by their means."""
    if paired:
        if len(a) != len(b):
            raise ValueError(f"a paired comparison needs one value per seed on both sides, got {len(a)} and {len(b)}")
        if len(a) < 2:
            return "untested"
        diffs = [x - y for x, y in zip(a, b)]
        se = mean_std(diffs)["std"] / math.sqrt(len(diffs))
    else:
        se = standard_error_of_difference(a, b)
    if se is None:
        return "untested"
    d = mean_std(a)["mean"] - mean_std(b)["mean"]
    if not higher:
        d = -d
    if d > k * se:
        return "better"
    if -d > k * se:
        return "worse"
    return "tie"
