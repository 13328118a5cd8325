"""Smoke run of benchmarks/spill_training.py (tiny preset; no timing assertions)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
KEYS = {"step_time_ratio", "max_pred_diff", "ram_budget_gb", "cold_gb", "peak_rss_gb_spill", "peak_rss_gb_ram"}


def test_spill_training_smoke_preset(tmp_path):
    out = tmp_path / "out"
    args = [sys.executable, str(ROOT / "benchmarks" / "spill_training.py"), "--preset", "smoke", "--out", str(out),
            "--workdir", str(tmp_path)]
    res = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((out / "spill_training.json").read_text())
    s = doc["summary"]
    assert KEYS <= set(s), s
    # the spilling trainer predicts what the all-in-RAM one does (float rounding only)
    assert s["max_abs_pred"] > 1e-2
    assert s["max_pred_diff"] <= 1e-4 * max(1.0, s["max_abs_pred"]), s["max_pred_diff"]
    # rows went to disk, the rest stayed within the budget, and nothing was lost
    assert all(n > 0 for n in s["rows_cold"].values()), s["rows_cold"]
    assert {k: s["rows_cold"][k] + s["rows_hot"][k] for k in s["rows_hot"]} == s["rows_total"]
    assert all(n <= doc["main_run"]["spill"]["hot_rows_budget"] for n in s["rows_hot"].values())
    assert s["cold_gb"] > 0 and s["ram_budget_gb"] > 0
    assert s["step_time_ratio"] is not None and math.isfinite(s["step_time_ratio"]) and s["step_time_ratio"] > 0
    assert s["callbacks_per_step"] > 0 and s["cold_gb_read_per_step"] > 0
    assert doc["command"].startswith("python benchmarks/spill_training.py")
    assert (out / "spill_training.png").stat().st_size > 0
    assert doc["deleted_workdir"] and not list(tmp_path.glob("growmem-spill-training-*"))
