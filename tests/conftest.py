"""Shared helpers: plain-numpy (float64) reference formulas, independent of growmem.

The formulas are written straight from the paper (Eq. 1, Eq. 8 / Alg. 3, Alg. 5) and
are exposed through the ``ref`` fixture so every test file checks growmem against
the same independent computation.
"""
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

# Datasets: the project's shared copy (MNIST) when it is there and GROWMEM_DATA is unset; the
# package itself never assumes that folder (growmem.data searches $GROWMEM_DATA, then ~/.cache/growmem).
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if _SHARED_DATA.is_dir():
    os.environ.setdefault("GROWMEM_DATA", str(_SHARED_DATA))


def pytest_sessionstart(session):
    """In CI nothing may be skipped for want of data or of an extra: fail at once instead."""
    if not os.environ.get("CI"):
        return
    from growmem.data import mnist
    if not mnist.available():
        raise pytest.UsageError(f"CI needs the MNIST IDX files: set GROWMEM_DATA (searched "
                                f"{[str(d) for d in mnist.candidate_dirs(None)]})")
    try:
        import avalanche  # noqa: F401
    except ImportError:
        raise pytest.UsageError("CI needs the continual extra: pip install -e '.[all]'") from None


def np_linear(q, k, v, coeff=None):
    """Eq. 1 without W0: ``Σ_i c_i ⟨k_i, q⟩ v_i``."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    c = np.ones(k.shape[0]) if coeff is None else np.asarray(coeff, np.float64)
    return ((q @ k.T) * c[None, :]) @ v


def np_rbf(q, k, v, temperature, coeff=None):
    """Alg. 5: ``Σ_i c_i exp(-‖q - k_i‖² / (2 T √d)) v_i`` (explicit differences)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    c = np.ones(k.shape[0]) if coeff is None else np.asarray(coeff, np.float64)
    d2 = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    return (np.exp(-d2 / (2.0 * temperature * np.sqrt(q.shape[1]))) * c[None, :]) @ v


def np_weighted_softmax(q, k, vt, w, temperature, coeff=None):
    """Eq. 8: ``Σ c_i e^{a_i} ṽ_i / Σ c_i w_i e^{a_i}``, ``a_i = ⟨k_i,q⟩/(T√d)``.

    Evaluated in float64 with the scores shifted by the per-query maximum of ``a``
    (the shift cancels in the ratio). Fine for moderate temperatures; see
    ``np_weighted_softmax_logspace`` for extreme ones.
    """
    q, k, vt, w = (np.asarray(a, np.float64) for a in (q, k, vt, w))
    c = np.ones(k.shape[0]) if coeff is None else np.asarray(coeff, np.float64)
    if k.shape[0] == 0:
        return np.zeros((q.shape[0], vt.shape[1]))
    a = (q @ k.T) / (temperature * np.sqrt(q.shape[1]))
    e = np.exp(a - a.max(axis=1, keepdims=True)) * c[None, :]
    return (e @ vt) / (e @ w)[:, None]


def np_weighted_softmax_logspace(q, k, vt, w, temperature):
    """Eq. 8 for ``w >= 0`` at any temperature, in float64.

    Shifts every query's scores by ``m = max_i (a_i + log w_i)`` over rows with ``w_i > 0``
    (the term that dominates the denominator, so ``den >= 1``). Returns the output and a
    mask of queries whose true output is finite and below 1e30 in magnitude (representable
    in float32 with margin); elsewhere the value is meaningless.
    """
    q, k, vt, w = (np.asarray(a, np.float64) for a in (q, k, vt, w))
    a = (q @ k.T) / (temperature * np.sqrt(q.shape[1]))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        logw = np.where(w > 0, np.log(np.where(w > 0, w, 1.0)), -np.inf)
        m = np.max(a + logw[None, :], axis=1, keepdims=True)
        e = np.exp(a - m)
        num = e @ vt
        den = e @ w
        out = num / den[:, None]
    ok = np.all(np.isfinite(out), axis=1) & (np.max(np.abs(np.nan_to_num(out)), axis=1) < 1e30)
    return out, ok


def np_rms_norm(x, eps=1e-6):
    """RMSNorm without scale (``‖x̂‖ = √d``), written independently of growmem."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


REF = SimpleNamespace(linear=np_linear, rbf=np_rbf, weighted_softmax=np_weighted_softmax,
                      weighted_softmax_logspace=np_weighted_softmax_logspace, rms_norm=np_rms_norm)


@pytest.fixture
def ref():
    """Namespace of the numpy reference formulas above."""
    return REF


@pytest.fixture
def small_tmpfs(tmp_path):
    """``small_tmpfs(size) -> Path``: a real tmpfs of ``size`` (e.g. "256k") mounted under
    ``tmp_path`` and unmounted after the test — a disk that really fills. Skips the test
    where mounting is not allowed (not root, no ``mount``, a container without the right)."""
    import os
    import shutil
    import subprocess

    mounted = []

    def mount(size: str):
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("needs root and mount(8) to mount a small tmpfs")
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount tmpfs: {r.stderr.decode()[:200]}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def distributed_run():
    """``distributed_run(script, args_of) -> logs``: start ``python script *args_of(i, port)`` for
    processes ``i = 0, 1`` with one free coordinator ``port`` (a real 2-process
    ``jax.distributed`` run on localhost, CPU), wait for both, and fail with their logs if
    either exits non-zero."""
    import os
    import socket
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}

    def run(script, args_of, n: int = 2, timeout: int = 300):
        with socket.socket() as sock:
            sock.bind(("localhost", 0))
            port = sock.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, str(script), *map(str, args_of(i, port))], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]
        try:
            logs = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
                p.wait()
        assert all(p.returncode == 0 for p in procs), "\n----\n".join(l[-3000:] for l in logs)
        return logs

    return run
