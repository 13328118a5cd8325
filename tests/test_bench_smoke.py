"""The retrieval benchmark runs end to end on its smoke preset and writes its results.

No timing assertions: the machine running the tests may be slow or busy.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_retrieval_benchmark_smoke_writes_summary_and_plot(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "retrieval.py"), "--preset", "smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "retrieval.json").read_text())
    summary = doc["summary"]
    for key in ("min_ratio_batch_ge_64", "step_time_exponent"):
        assert isinstance(summary[key], float) and math.isfinite(summary[key]), (key, summary.get(key))
    assert summary["min_ratio_batch_ge_64"] > 0
    assert doc["retrieval"] and doc["train_step"]["t_step_s"]
    assert all(math.isfinite(r["ratio_weighted_softmax"]) and math.isfinite(r["ratio_rbf"]) for r in doc["retrieval"])
    png = tmp_path / "retrieval.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "min ratio at B >= 64" in proc.stdout
