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
from typing import Any, Dict


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
