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

from .errors import ConfigError


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


def host() -> Dict[str, Any]:
    """The machine a number was measured on: the CPU's model name (``/proc/cpuinfo``), the widest instruction
    set the native kernel runs there (None without it) and the cores. A growing network's run is bitwise
    repeatable on one machine; another CPU rounds differently, and an error-driven memory amplifies it."""
    from growmem import native

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    isa = native.isas()
    return {"cpu": model, "isa": isa[0] if isa else None, "cores": os.cpu_count()}


def _checkout() -> Dict[str, Any]:
    """``{"git_commit", "git_dirty"}`` of the git checkout growmem is imported from (an editable install, the
    benchmarks' clone); both None for an installed package, even one that sits inside another repository."""
    import subprocess

    pkg = Path(__file__).resolve().parent

    def git(*cmd):
        return subprocess.run(["git", "-C", str(pkg), *cmd], capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() / pkg.name != pkg:
            return {"git_commit": None, "git_dirty": None}
        return {"git_commit": git("rev-parse", "HEAD").stdout.strip() or None,
                "git_dirty": bool(git("status", "--porcelain").stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def environment() -> Dict[str, Any]:
    """Where a result came from, the one record every result file carries (``write_json`` adds it): when
    (UTC), the Python / JAX / growmem versions, the backend and devices, the host (:func:`host`), the load
    average while it was written and the growmem checkout's commit."""
    import jax

    from .version import __version__

    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": sys.version.split()[0], "jax": jax.__version__, "growmem": __version__,
            "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "platform": platform.platform(), "machine": platform.machine(), **host(),
            "load_average": load, **_checkout()}


def write_json(path, payload: Dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (tmp file + rename), with its ``environment`` (:func:`environment`)
    unless the payload brings one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = dict(payload)
    if "environment" not in payload:
        payload["environment"] = environment()
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


# --------------------------------------------------------------------------- progress

def progress_bar(total, desc: str, *, initial: int = 0, unit: str = "step", leave: bool = True,
                 enabled: bool = True):
    """growmem's one progress bar (rate and ETA): a tqdm bar on a terminal, or anywhere with
    ``GROWMEM_PROGRESS=1`` — a log or a pipe gets the results, not bar frames; None where not ``enabled``.
    ``total`` may be None (unknown yet: set ``bar.total`` later)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm
    force = os.environ.get("GROWMEM_PROGRESS") == "1"
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave,
                file=sys.stderr, disable=False if force else None)


# --------------------------------------------------------------------------- mean ± std, and ties

def mean_std(values: Sequence[float]) -> Dict[str, Any]:
    """``{"mean", "std", "n", "values"}``: ``std`` is the sample standard deviation (ddof = 1; 0.0 for a
    single value, which ``n == 1`` marks as unmeasured)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ConfigError("mean_std needs at least one value")
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


#: the confidence of every verdict: a two-sided Student t-test at 95 %
CONFIDENCE = 0.95
#: how verdicts are decided, in words (rendered beside every table)
RULE = "paired Student t-test at 95 % (t quantile with n − 1 degrees of freedom); otherwise a tie"


def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student t quantile ``t_{1−(1−confidence)/2, df}`` (scipy.stats.t)."""
    from scipy.stats import t

    if not (0 < confidence < 1) or not df > 0:
        raise ConfigError(f"t_quantile needs 0 < confidence < 1 and df > 0, got confidence={confidence}, df={df}")
    return float(t.ppf(1 - (1 - confidence) / 2, df))


def _t_test(a: Sequence[float], b: Sequence[float], paired: bool):
    """``(mean difference a − b, its standard error, degrees of freedom)``; None when a side has fewer
    than two values. Paired: the per-seed differences, ``n − 1`` degrees of freedom; unpaired: Welch's
    standard error and Welch–Satterthwaite degrees of freedom."""
    if paired:
        if len(a) != len(b):
            raise ConfigError(f"a paired comparison needs one value per seed on both sides, got {len(a)} and {len(b)}")
        if len(a) < 2:
            return None
        diffs = mean_std([x - y for x, y in zip(a, b)])
        return diffs["mean"], diffs["std"] / math.sqrt(len(a)), len(a) - 1
    se = standard_error_of_difference(a, b)
    if se is None:
        return None
    va, vb = mean_std(a)["std"] ** 2 / len(a), mean_std(b)["std"] ** 2 / len(b)
    df = (va + vb) ** 2 / ((va * va / (len(a) - 1)) + (vb * vb / (len(b) - 1))) if va + vb > 0 else float(len(a) + len(b) - 2)
    return mean_std(a)["mean"] - mean_std(b)["mean"], se, df


def compare(a: Sequence[float], b: Sequence[float], *, higher: bool = True, confidence: float = CONFIDENCE,
            paired: bool = False) -> str:
    """``"better"`` if ``a`` beats ``b`` (higher mean when ``higher``) by a two-sided Student t-test at
    ``confidence`` (|d| > t_{n−1} · SE), ``"worse"`` if ``b`` beats ``a`` by as much, else ``"tie"``;
    ``"untested"`` when a side has fewer than two values. ``paired``: ``a[i]`` and ``b[i]`` come from the
    same seed (stream, order, initialisation): the test of the per-seed differences, ``n − 1`` degrees
    of freedom; else Welch's test. Two sides without any spread are told apart by their means."""
    r = _t_test(a, b, paired)
    if r is None:
        return "untested"
    d, se, df = r
    if not higher:
        d = -d
    bar = t_quantile(df, confidence) * se
    if d > bar:
        return "better"
    if -d > bar:
        return "worse"
    return "tie"


def seeds_needed(a: Sequence[float], b: Sequence[float], *, paired: bool = True, confidence: float = CONFIDENCE,
                 limit: int = 100_000) -> Optional[int]:
    """The fewest seeds (per side) at which ``mean(a) − mean(b)`` — assumed to stay what it is, with the
    same spread — would pass :func:`compare`'s test: the least ``n`` with ``|d| > t_{n−1} s / √n``,
    ``s`` the standard deviation of the per-seed differences (paired) or ``√(s_a² + s_b²)``
    (unpaired, with ``2n − 2`` degrees of freedom). None when it cannot be estimated: fewer than two
    values on a side, no difference or no spread, or more than ``limit`` seeds."""
    if len(a) < 2 or len(b) < 2:
        return None
    if paired:
        diffs = mean_std([x - y for x, y in zip(a, b)])
        d, s = diffs["mean"], diffs["std"]
    else:
        d = mean_std(a)["mean"] - mean_std(b)["mean"]
        s = math.sqrt(mean_std(a)["std"] ** 2 + mean_std(b)["std"] ** 2)
    if d == 0 or s == 0:
        return None
    z = t_quantile(1e9, confidence)               # the normal quantile: a lower bound on every t quantile
    n = max(2, int(math.ceil((z * s / abs(d)) ** 2)))
    while n <= limit:
        df = n - 1 if paired else 2 * n - 2
        if abs(d) > t_quantile(df, confidence) * s / math.sqrt(n):
            return n
        n += 1
    return None
