"""Smoke runs of the storage benchmarks (tiny presets; no timing assertions)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}

KEYS = {
    "spill": {"read_bandwidth_fraction", "peak_rss_gb", "ram_budget_gb", "cold_gb"},
    "checkpoint": {"save_ratio_vs_numpy", "restore_ratio_vs_numpy"},
    "sharded": {"overhead_ratio"},
}


@pytest.mark.parametrize("name", [pytest.param("checkpoint", marks=pytest.mark.slow), "spill",
                                  pytest.param("sharded", marks=pytest.mark.slow)])
def test_storage_benchmark_smoke_preset_writes_summary_and_plot(tmp_path, name):
    args = [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--preset", "smoke", "--out", str(tmp_path)]
    if name == "spill":
        args += ["--workdir", str(tmp_path)]
    res = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert KEYS[name] <= set(doc["summary"]), doc["summary"]
    assert all(doc["summary"][k] is not None for k in KEYS[name])
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    if name == "spill":
        assert doc["deleted_workdir"] and not list(tmp_path.glob("growmem-spill-*"))
        s = doc["summary"]
        assert s["local_reads"] is True and s["peak_rss_build_gb"] > 0 and s["peak_rss_gb"] >= s["peak_rss_build_gb"]
        if doc["page_cache"]["drop_caches_writable"]:   # root: the cold-cache regime, O_DIRECT and TensorStore runs
            cold = doc["regimes"]["cold_cache"]
            assert s["raw_direct_read_gb_per_s"] == cold["raw_direct_read_gb_per_s"] > 0
            assert abs(s["fraction_of_direct_read"] * s["raw_direct_read_gb_per_s"] - s["achieved_gb_per_s"]) < 1e-9
            ts = doc["tensorstore_reads"]
            assert s["tensorstore_reads_fraction"] == ts["fraction"] > 0
            assert abs(ts["local_reads_speedup"] - ts["retrieval_s"] / cold["retrieval_s"]) < 1e-12
