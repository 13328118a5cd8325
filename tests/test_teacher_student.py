"""Smoke runs of the main job and of the teacher-student reproduction (no timing assertions)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

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


# ------------------------------------------------------------------------------------------ a unit killed

class _Killed(Exception):
    """Stands for a kill: raised from the progress callback after a chosen step."""


def _kill_after(n_steps):
    seen = []

    def progress(n):
        seen.append(n)
        if sum(seen) >= n_steps:
            raise _Killed(sum(seen))
    return progress


def test_a_run_killed_mid_way_goes_on_from_its_last_checkpoint_to_the_uninterrupted_result(tmp_path):
    from growmem.repro import teacher_student as ts
    task = TeacherStudent(seed=0)
    kw = dict(steps=12, batch=16, temperature=1.0, eta=30.0, beta=0.3, momentum=0.6, eval_every=3,
              test=task.test_set(128))
    ref = ts.run_growing_ws(task, **kw)
    unit = tmp_path / "unit"
    with pytest.raises(_Killed):   # checkpoints after steps 3 and 6 (every evaluation: no wait), killed after 8
        ts.run_growing_ws(task, **kw, progress=_kill_after(8), unit=unit, unit_every_s=0)
    told = []
    out = ts.run_growing_ws(task, **kw, progress=told.append, unit=unit, unit_every_s=0)
    assert told[0] == 6 and sum(told) == 12        # the 6 steps of the checkpoint, then 6 trained again
    for k in ("curve", "train_loss", "rows", "final_test_loss"):
        assert out[k] == ref[k], k                 # bitwise: the batches are a function of the step
    assert [w[0] for w in out["wall"]] == [w[0] for w in ref["wall"]]
    assert all(b[1] >= a[1] for a, b in zip(out["wall"], out["wall"][1:]))   # one clock over both processes
    assert out["seconds"] >= out["wall"][-1][1]
    # without a folder nothing is saved; a folder of another loop is refused, not trained on
    with pytest.raises(_Killed):
        ts.run_growing_ws(task, **kw, progress=_kill_after(8), unit=tmp_path / "other", unit_every_s=0)
    from growmem.checkpoint import ConfigMismatchError
    with pytest.raises(ConfigMismatchError, match="steps"):
        ts.run_growing_ws(task, **{**kw, "steps": 15}, unit=tmp_path / "other", unit_every_s=0)


def test_the_repro_resumes_a_killed_unit_from_its_checkpoint_and_removes_it_when_done(tmp_path, monkeypatch):
    from growmem import repro
    from growmem.repro import core
    tiny = {"steps": 8, "select_steps": 4, "eval_every": 4, "checkpoints": [64, 128], "test_size": 64,
            "seeds": [0], "unit_every_s": 0, "mlp": {"lr": [0.1]}, "extend": {}}
    told = []
    update = core.Context.update

    def killing_update(self, n=1):
        told.append(n)
        if sum(told) == 4 + 6:         # the growing model's sweep (4 steps), then 6 steps of its full run
            raise _Killed()
        update(self, n)

    monkeypatch.setattr(core.Context, "update", killing_update)
    with pytest.raises(_Killed):
        repro.run("teacher-student", "smoke", out=tmp_path, progress=False, overrides=tiny)
    units = tmp_path / "teacher-student.units"
    (held,) = units.iterdir()                       # the full run's checkpoint after its step 4
    assert sorted(p.name for p in held.iterdir() if p.name.isdigit()) == ["4"]
    told.clear()
    monkeypatch.setattr(core.Context, "update", lambda self, n=1: told.append(n))
    doc = repro.run("teacher-student", "smoke", out=tmp_path, progress=False, overrides=tiny, resume=True)
    # the sweep's unit is read back (its 4 steps at once), the killed one goes on from its step 4, then the rest
    assert told[:6] == [4, 4, 1, 1, 1, 1] and sum(told) == 3 * (4 + 8)
    assert not units.exists() and not (tmp_path / "teacher-student.partial.jsonl").exists()
    assert doc["summary"]["samples"] == 128
    # a run without --resume starts afresh: it removes what a killed run left
    units.mkdir()
    (units / "left").mkdir()
    core.Context("teacher-student", "smoke", tmp_path, resume=False)
    assert not units.exists()
