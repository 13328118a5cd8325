"""Shared helpers: plain-numpy (float64) reference formulas, independent of growmem.

The formulas are written straight from the paper (Eq. 1, Eq. 8 / Alg. 3, Alg. 5) and
are exposed through the ``ref`` fixture so every test file checks growmem against
the same independent computation.
"""
import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import fixture_data

# Datasets. Every test reads generated MNIST-format IDX files (tests/fixture_data.py), checked against
# their own checksums through the explicit override $GROWMEM_DATA_CHECKSUMS, so the suite needs no real
# data. Tests that need the real files take the ``real_mnist`` fixture (marked ``data``): it looks in the
# user's $GROWMEM_DATA as it was, the project's shared copy and ~/.cache/growmem; the package itself never
# assumes the shared folder.
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# the user's $GROWMEM_DATA before this file replaced it: kept in the environment, so the xdist workers
# (which inherit the replaced one) still look where the user pointed and never at a generated folder
os.environ.setdefault("GROWMEM_TESTS_USER_DATA", os.environ.get("GROWMEM_DATA", ""))
_REAL_ROOTS = [r for r in (os.environ["GROWMEM_TESTS_USER_DATA"], str(_SHARED_DATA),
                           str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "growmem")) if r]
FETCH_HINT = "needs the real MNIST files: run `growmem data download mnist` (or set GROWMEM_DATA to their folder)"


def _make_fixture_data() -> Path:
    root = Path(tempfile.mkdtemp(prefix="growmem-testdata-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    sums = {"mnist": fixture_data.write_mnist(root / "mnist")}
    (root / "checksums.json").write_text(json.dumps(sums))
    return root


def _compilation_cache() -> None:
    """One persistent XLA compilation cache for the whole run — this process, the xdist workers and every
    subprocess a test starts inherit it — so a program compiled once (a train step, a CLI's model) is
    loaded, not compiled again, by the next test or interpreter that needs it. A fresh folder per run,
    removed at exit (a user's own $JAX_COMPILATION_CACHE_DIR is kept as it is)."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        d = tempfile.mkdtemp(prefix="growmem-test-xla-cache-")
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = d
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


_compilation_cache()
FIXTURE_DATA = _make_fixture_data()
os.environ["GROWMEM_DATA"] = str(FIXTURE_DATA)
os.environ["GROWMEM_DATA_CHECKSUMS"] = str(FIXTURE_DATA / "checksums.json")


def benchmark(name: str):
    """``benchmarks/NAME.py`` as a module, loaded afresh (a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).resolve().parents[1] / "benchmarks"
                                                  / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def real_data_root(name: str = "mnist"):
    """The first folder holding the real ``name`` files (checked against the pinned checksums'
    names, not read), or None."""
    from growmem.data import datasets
    spec = datasets.DATASETS[name]
    for root in _REAL_ROOTS:
        for d in (Path(root) / name, Path(root)):
            if d.is_dir() and not datasets._missing(spec, d):
                return Path(root)
    return None


def pytest_collection_modifyitems(config, items):
    """A test that takes ``real_mnist`` is a ``data`` test (``-m "not data"`` leaves them out)."""
    for item in items:
        if "real_mnist" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.data)


@pytest.fixture
def real_mnist(monkeypatch):
    """``$GROWMEM_DATA`` pointed at the real MNIST files, with the pinned checksums (the override is
    removed). Outside CI a machine without them skips the test, naming the command that fetches them;
    with ``CI`` set that is a failure: nothing may skip in CI."""
    root = real_data_root("mnist")
    if root is None:
        where = ", ".join(_REAL_ROOTS)
        if os.environ.get("CI"):
            pytest.fail(f"CI {FETCH_HINT}; searched {where}")
        pytest.skip(f"{FETCH_HINT}; searched {where}")
    monkeypatch.setenv("GROWMEM_DATA", str(root))
    monkeypatch.delenv("GROWMEM_DATA_CHECKSUMS", raising=False)
    return root


def pytest_sessionstart(session):
    """In CI nothing may be skipped for want of data or of an extra: fail at once instead."""
    if not os.environ.get("CI"):
        return
    if real_data_root("mnist") is None:
        raise pytest.UsageError(f"CI {FETCH_HINT}; searched {_REAL_ROOTS}")
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


def coordinator_port() -> int:
    """A free port for a ``jax.distributed`` coordinator that no other test process can be given: each
    pytest-xdist worker (``gw0``, ``gw1``, ...) takes ports from its own block of 500 below the kernel's
    ephemeral range (32768+), so two workers' runs never race for one port; within a worker tests run
    one at a time, and a port some other program holds is skipped."""
    import socket
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    base = 20000 + 500 * (index % 24)
    for port in range(base, base + 500):
        with socket.socket() as sock:
            try:
                sock.bind(("localhost", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {base}..{base + 499} for the jax.distributed coordinator")


@pytest.fixture
def distributed_run():
    """``distributed_run(script, args_of) -> logs``: start ``python script *args_of(i, port)`` for
    processes ``i = 0, 1`` with one free coordinator ``port`` (a real 2-process
    ``jax.distributed`` run on localhost, CPU), wait for both, and fail with their logs if
    either exits non-zero."""
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}

    def run(script, args_of, n: int = 2, timeout: int = 300):
        port = coordinator_port()
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


def in_place_report(compiled, table_bytes: int):
    """What XLA's buffer assignment says of a compiled, donating program (``jax.stages.Compiled``):
    ``(aliased, temp)`` — bytes of outputs that reuse a donated input, and bytes of scratch buffers.
    A program that updates its tables in place aliases them and needs less scratch than one table."""
    ma = compiled.memory_analysis()
    return ma.alias_size_in_bytes, ma.temp_size_in_bytes


def assert_in_place(compiled, table_bytes: int, tables: int = 1):
    """The compiled program writes its ``tables`` donated tables of ``table_bytes`` each in place: they
    alias their inputs, and no scratch buffer as large as one of them is allocated (a copy would be)."""
    aliased, temp = in_place_report(compiled, table_bytes)
    assert aliased >= tables * table_bytes, f"only {aliased} B of outputs alias donated inputs ({tables} x {table_bytes} B expected)"
    assert temp < table_bytes, f"{temp} B of scratch: a copy of a {table_bytes} B table"
