"""The native kernel's benchmarks on their smoke presets: benchmarks/layer_kernel.py (one layer on
both paths against the matmul rate and the read bandwidth) and the XLA run of
benchmarks/single_pass.py (both paths in one run). No timing assertions: the machine may be busy."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from growmem import native

ROOT = Path(__file__).resolve().parent.parent


def _run(script, out, *args):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--preset", "smoke", "--out", str(out),
                          *args], env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _native_isa():
    if not native.available():
        if os.environ.get("CI"):
            pytest.fail("CI needs the native kernel built (pip install -e .)")
        pytest.skip("the native kernel is not built here")
    return native.isas()[0]


def _finite(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_layer_kernel_smoke_times_both_paths_against_the_same_floors(tmp_path):
    isa = _native_isa()
    out = _run("layer_kernel.py", tmp_path)
    doc = json.loads((tmp_path / "layer_kernel.json").read_text())
    s, recs = doc["summary"], doc["records"]
    assert _finite(s["matmul_gflops_per_s"]) and _finite(s["read_bandwidth_gb_per_s"])
    assert {r["dtype"] for r in recs} == {"float32", "bfloat16"} and {r["pass"] for r in recs} == {"fwd", "fwd_bwd"}
    for r in recs:
        assert r["native"]["path"] == isa and r["xla"]["path"] == "xla", r
        # the programs timed are the ones compiled for each path
        assert r["native"]["calls_native"] and not r["xla"]["calls_native"], r
        # the flops and bytes of the pass the record names: 2·B·(d_in + d_out) per row read, rows read once
        # forward and twice forward + backward
        passes = 1 if r["pass"] == "fwd" else 2
        assert r["flops"] == passes * r["rows"] * 2 * r["batch"] * (784 + 784)
        width = 4 if r["dtype"] == "float32" else 2
        assert r["bytes"] == passes * r["rows"] * (width * 2 * 784 + 4)
        floor = max(r["bytes"] / (s["read_bandwidth_gb_per_s"] * 1e9), r["flops"] / (s["matmul_gflops_per_s"] * 1e9))
        assert math.isclose(r["floor_s"], floor, rel_tol=1e-9)
        for path in ("native", "xla"):
            p = r[path]
            assert _finite(p["ms"]) and p["min_ms"] <= p["ms"]
            assert math.isclose(p["ratio_to_roofline"], p["ms"] / 1e3 / r["floor_s"], rel_tol=1e-9)
            assert math.isclose(p["matmul_fraction"], r["flops"] / (p["ms"] / 1e3) / (s["matmul_gflops_per_s"] * 1e9),
                                rel_tol=1e-9)
        assert _finite(r["speedup"])
    for dt in ("float32", "bfloat16"):
        assert _finite(s[dt]["native_ms"]) and s[dt]["native_path"] == isa
    assert math.isclose(s["bf16_over_fp32"], s["bfloat16"]["native_ms"] / s["float32"]["native_ms"], rel_tol=1e-9)
    assert (tmp_path / "layer_kernel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "speedup" in out


def test_single_pass_smoke_reports_the_native_and_the_xla_path(tmp_path):
    isa = _native_isa()
    out = _run("single_pass.py", tmp_path, "--runs", "weighted_softmax,xla,bf16")
    doc = json.loads((tmp_path / "single_pass.json").read_text())
    s = doc["summary"]
    assert s["kernels"] == f"native:{isa}" and s["bf16"]["kernels"] == f"native:{isa}"
    x = s["xla"]
    assert x["kernels"] == "xla" and 0 < x["accuracy"] <= 1 and _finite(x["wall_s"])
    assert math.isclose(x["native_speedup"], x["wall_s"] / s["wall_s"], rel_tol=1e-9)
    runs = {r["label"]: r for r in doc["runs"]}
    xr = runs["weighted_softmax fp32 xla"]
    assert math.isclose(x["ratio_to_roofline"], xr["wall_s"] / xr["roofline_floor_s"], rel_tol=1e-9)
    # the same pass on both paths: the same rows are grown (the rules see the same outputs up to rounding)
    fp = runs["weighted_softmax fp32"]
    assert xr["steps"] == fp["steps"] and abs(xr["accuracy"] - fp["accuracy"]) <= 0.05
    assert "fp32 on the XLA path" in out
