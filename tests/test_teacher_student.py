"""Smoke runs of the main job and of the teacher-student reproduction (no timing assertions)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from growmem.data.teacher_student import TeacherStudent

ROOT = Path(__file__).resolve().parents[1]


def test_teacher_matches_its_definition():
    # F.1.2: x on the unit sphere; y = W_out (e + relu(W_1 e)), e = relu(W_in x), no biases
    task = TeacherStudent(seed=3)
    x, y = task.sample(jax.random.key(0), 32)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(x), axis=1), 1.0, rtol=1e-5)
    p = task.variables["params"]
    w_in, w_1, w_out = (np.asarray(p[f"Dense_{i}"]["kernel"]) for i in range(3))
    assert w_in.shape == (100, 100) and w_out.shape == (100, 1)
    e = np.maximum(np.asarray(x) @ w_in, 0)
    e = e + np.maximum(e @ w_1, 0)
    np.testing.assert_allclose(np.asarray(y), e @ w_out, rtol=1e-4, atol=1e-6)
    # LeCun normal (fan-in): variance 1/fan_in
    assert abs(w_in.var() * 100 - 1.0) < 0.15
    # batches are deterministic per step and differ between steps
    a1, _ = task.batch(5, 8)
    a2, _ = task.batch(5, 8)
    b1, _ = task.batch(6, 8)
    assert np.array_equal(np.asarray(a1), np.asarray(a2)) and not np.allclose(np.asarray(a1), np.asarray(b1))


def test_growmem_train_writes_metrics_and_plot(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "growmem.app.cli", "train", "--steps", "12", "--batch-size", "16",
                        "--eval-every", "6", "--test-size", "128", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((out / "metrics.json").read_text())
    assert (out / "plot.png").stat().st_size > 1000
    assert [s for s, _ in m["test_curve"]] == [0, 96, 192]
    assert all(math.isfinite(l) for _, l in m["test_curve"])
    # D0 (16 rows) + 12 steps x 16 rows, all admitted
    assert m["rows"] == {"readout": 16 + 12 * 16}
    assert "steps/s" in r.stdout or "step/s" in r.stderr  # progress with a rate


def test_growmem_train_rejects_bad_arguments(tmp_path):
    r = subprocess.run([sys.executable, "-m", "growmem.app.cli", "train", "--steps", "0", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and "--steps: must be a positive integer, got 0" in r.stderr


def test_teacher_student_smoke_preset(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import teacher_student
    finally:
        sys.path.pop(0)
    payload = teacher_student.main(["--preset", "smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "teacher_student.json").read_text())
    assert (tmp_path / "teacher_student.png").stat().st_size > 1000
    s = data["summary"]
    assert set(s["final_test_loss"]) == {"growing_weighted_softmax", "parametric_softmax", "reference_mlp"}
    assert all(math.isfinite(v) for v in s["final_test_loss"].values())
    cfg = teacher_student.PRESETS["smoke"]
    assert s["samples"] == cfg["steps"] * cfg["batch"]
    # the parametric softmax is as wide as the final database of the growing model
    gws_rows = payload["runs"]["growing_weighted_softmax"][0]["rows"]["readout"]
    assert s["chosen_hyperparameters"]["parametric_softmax"]["width"] == gws_rows
    # the chosen configuration is the one with the lowest final loss
    for name, runs in data["runs"].items():
        assert s["final_test_loss"][name] == min(r["final_test_loss"] for r in runs)
