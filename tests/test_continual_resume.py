"""A continual run killed with SIGKILL mid-stream resumes with resume=True at the experience and
batch its checkpoints reached, and ends with the same results as an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "continual_resume_worker.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def _run_until(args, stop_line):
    """Start the worker, SIGKILL it once it printed ``stop_line`` (where it waits); return the lines it printed."""
    p = subprocess.Popen([sys.executable, WORKER, *args, "--hang-at", stop_line], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    seen = []
    try:
        for line in p.stdout:
            seen.append(line.strip())
            if line.strip() == stop_line:
                p.send_signal(signal.SIGKILL)
                break
    finally:
        p.kill()
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL, seen[-5:]
    return seen


def test_resume_after_sigkill_mid_stream_gives_the_uninterrupted_results(tmp_path):
    ref_out, out, ckpt = tmp_path / "ref.json", tmp_path / "resumed.json", tmp_path / "ckpt"
    # the uninterrupted reference runs beside the runs we kill
    ref = subprocess.Popen([sys.executable, WORKER, str(ref_out)], env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    # 1) killed inside growmem's second experience (10 batches each, a checkpoint every 3 batches)
    first = _run_until([str(tmp_path / "never.json"), "--ckpt", str(ckpt)], "net:continual_growmem exp 1 batch 8")
    assert "net:continual_growmem exp 0 batch 10" in first and not (tmp_path / "never.json").exists()
    # 2) resumed: growmem continues after batch 6 of experience 1; killed again inside naive's second experience
    second = _run_until([str(tmp_path / "never.json"), "--ckpt", str(ckpt), "--resume"], "naive exp 1 batch 2")
    assert second[0] == "net:continual_growmem exp 1 batch 7", second[:3]
    # 3) resumed again: growmem is done; naive restarts experience 1 from its state after experience 0
    res = subprocess.run([sys.executable, WORKER, str(out), "--ckpt", str(ckpt), "--resume"], env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.split("\n")
    assert lines[0] == "naive exp 1 batch 1" and not any(l.startswith("net:") for l in lines), lines[:3]
    assert ref.wait(timeout=600) == 0, ref.stderr.read()[-3000:]
    a, b = json.loads(ref_out.read_text()), json.loads(out.read_text())
    assert [r["method"] for r in b] == ["net:continual_growmem", "naive"] and all(r["resumed"] for r in b)
    for ra, rb in zip(a, b):
        for key in ("accuracy_matrix", "acc_stream_weighted_after", "bytes", "prequential_acc", "summary"):
            assert ra[key] == rb[key], (ra["method"], key)
    assert len(a[0]["accuracy_matrix"]) == 3


def test_resume_refuses_a_different_configuration_and_a_fresh_run_refuses_a_used_directory(tmp_path, monkeypatch):
    from growmem.continual import runner
    from growmem.continual.runner import run_continual

    kw = dict(stream_options=dict(n_experiences=1, train_limit=32, test_limit=16), seeds=[0], progress=False,
              verbose=False, checkpoint_dir=tmp_path / "c")
    first = run_continual("drifting_teacher", methods=["naive"], **kw)
    try:
        run_continual("drifting_teacher", methods=["naive"], **kw)
    except ValueError as e:
        assert "--resume" in str(e)
    else:
        raise AssertionError("a second fresh run into the same checkpoint directory was not refused")
    try:
        run_continual("drifting_teacher", methods=["naive", "replay_1000"], resume=True, **kw)
    except ValueError as e:
        assert "methods" in str(e) and "replay_1000" in str(e)
    else:
        raise AssertionError("resuming with other methods was not refused")
    # the same configuration resumes: the finished run is read back, not redone (training it would raise)
    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again on resume")

    monkeypatch.setattr(runner, "_run_baseline", no_training)
    monkeypatch.setattr(runner, "_run_learner", no_training)
    doc = run_continual("drifting_teacher", methods=["naive"], resume=True, **kw)
    assert doc["runs"][0]["method"] == "naive" and len(doc["runs"][0]["accuracy_matrix"]) == 1
    for key in ("accuracy_matrix", "bytes", "summary"):
        assert doc["runs"][0][key] == first["runs"][0][key], key


class _Stop(Exception):
    pass


def test_template_loop_resumes_mid_experience_with_the_same_results(tmp_path):
    """GrowmemStrategy inside Avalanche's template: interrupted mid-experience, resumed."""
    from growmem.continual.runner import run_continual

    kw = dict(stream_options=dict(n_experiences=2, train_limit=96, test_limit=32), methods=["growmem"], seeds=[1],
              growmem_loop="template", checkpoint_every=2, progress=False, verbose=False)
    ref = run_continual("drifting_teacher", **kw)["runs"][0]

    def stop(info):
        if info["experience"] == 1 and info["batch"] == 5:
            raise _Stop

    try:
        run_continual("drifting_teacher", checkpoint_dir=tmp_path / "c", on_batch=stop, **kw)
    except _Stop:
        pass
    else:
        raise AssertionError("the run was not interrupted")
    seen = []
    res = run_continual("drifting_teacher", checkpoint_dir=tmp_path / "c", resume=True,
                        on_batch=lambda i: seen.append((i["experience"], i["batch"])), **kw)["runs"][0]
    assert seen[0] == (1, 5)  # the checkpoint after batch 4 of experience 1
    for key in ("accuracy_matrix", "acc_stream_weighted_after", "bytes", "prequential_acc"):
        assert ref[key] == res[key], key
    assert res["resumed"] and not ref["resumed"]
