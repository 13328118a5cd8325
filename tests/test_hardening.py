"""Nothing silent: bad data never enters a memory, runs never corrupt each other, every failure of
the ``growmem`` command is one line on stderr with a non-zero exit code and nothing half-written.

The CLI cases run the real command in a process of its own (exit code, stderr, the folders it touched),
forked from a warm interpreter (``tests/forked.py``) unless the case needs a fresh one (a signal, an
environment of its own)."""
import argparse
import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import forked
import growmem as gm
from growmem import kernels, policies
from growmem.train import NonFiniteLossError, fit
from growmem.checkpoint import CheckpointError

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
GROWMEM = [sys.executable, "-c", "import sys; from growmem.app.cli import main; sys.exit(main(sys.argv[1:]))"]
SMALL = ["--steps", "6", "--batch-size", "8", "--test-size", "32", "--eval-every", "3"]


def run(*args, cwd=None, timeout=300):
    """``growmem ARGS`` as its own process, forked from a warm interpreter (``tests/forked.py``)."""
    return forked.run(ENV, args, cwd=cwd, timeout=timeout)


def one_line_failure(r, match=None, code=None):
    """A failed command: non-zero exit, one line on stderr naming the problem, no traceback."""
    err = r.stderr.strip()
    assert r.returncode != 0, (r.returncode, r.stdout[-500:])
    if code is not None:
        assert r.returncode == code, (r.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    if match is not None:
        assert match in err, err
    return err


def tree(folder: Path):
    """``{relative path: bytes}`` of every file under ``folder`` (None when it does not exist)."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != ".growmem.lock"}


# ---------------------------------------------------------------------------- 1. spill folders and locks

def test_two_runs_sharing_a_spill_folder_never_touch_each_others_rows(tmp_path):
    spill = ["--steps", "60", "--ram-budget", "1MB", "--spill-dir", tmp_path / "S"]
    assert run("train", *spill, "--checkpoint-dir", tmp_path / "A", "--out", tmp_path / "oa").returncode == 0
    assert run("export", tmp_path / "A", "--npz", tmp_path / "a1.npz").returncode == 0
    cold = tree(tmp_path / "S")
    r = run("train", *spill, "--seed", "1", "--checkpoint-dir", tmp_path / "B", "--out", tmp_path / "ob")
    one_line_failure(r, "a tier already exists")
    assert tree(tmp_path / "S") == cold and not (tmp_path / "B").exists()
    # run A's rows are exactly what they were: export and resume read them
    assert run("export", tmp_path / "A", "--npz", tmp_path / "a2.npz").returncode == 0
    a1, a2 = np.load(tmp_path / "a1.npz"), np.load(tmp_path / "a2.npz")
    assert all(a1[k].tobytes() == a2[k].tobytes() for k in a1.files if k != "__description__")
    assert run("train", *spill[:-2], "--spill-dir", tmp_path / "S", "--steps", "62", "--checkpoint-dir",
               tmp_path / "A", "--resume", "--out", tmp_path / "oa").returncode == 0


def test_a_tier_of_another_run_is_refused_on_resume(tmp_path):
    from growmem.backends.tiered import ColdTier, TierError, Tiered
    from growmem.checkpoint import Checkpointer

    x = np.random.default_rng(0).normal(size=(40 * 32, 8)).astype(np.float32)
    y = np.sin(x[:, :2])
    spec = gm.GrowingSpec.make("rbf", eta=0.1)
    model = gm.ResidualGrowingNet(d_out=2, readout=spec)
    budget = 512 * gm.memory.row_bytes(8, 2)

    def trainer(tier):
        return gm.Trainer(model, loss="squared_error", sample_input=x[:1], backend=tier)

    a = trainer(Tiered(tmp_path / "S", ram_budget_bytes=budget, chunk_rows=256))
    for i in range(40):
        a.step(x[i * 32:(i + 1) * 32], y[i * 32:(i + 1) * 32])
    with Checkpointer(tmp_path / "A") as c:
        c.save(a)
    # another run deletes the folder and spills its own rows there
    other = ColdTier.create(tmp_path / "S2" / "readout", d_in=8, d_out=2, chunk_rows=256)
    url = ColdTier.open(tmp_path / "S" / "readout").url
    import shutil
    shutil.rmtree(tmp_path / "S" / "readout" / "gen-0")
    shutil.copytree(tmp_path / "S2" / "readout", tmp_path / "S" / "readout", dirs_exist_ok=True)
    assert ColdTier.read_manifest(url)["owner"] == other.owner
    b = trainer(Tiered(tmp_path / "S", ram_budget_bytes=budget, chunk_rows=256, resume=True))
    with pytest.raises(TierError, match="holds the rows of run .* not of run"):
        Checkpointer(tmp_path / "A").restore(b)


def test_a_second_run_on_one_checkpoint_folder_is_refused(tmp_path):
    ck = tmp_path / "ck"
    first = subprocess.Popen([*GROWMEM, "train", "--steps", "100000", "--checkpoint-every", "5", "--checkpoint-dir",
                              str(ck), "--out", str(tmp_path / "o1")], env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        saved = lambda: ck.is_dir() and any(p.name.isdigit() for p in ck.iterdir())  # noqa: E731 (old ones rotate out)
        for _ in range(600):
            if saved():
                break
            time.sleep(0.2)
        assert saved(), "the first run wrote no checkpoint"
        r = run("train", "--steps", "100000", "--checkpoint-dir", ck, "--resume", "--out", tmp_path / "o2")
        one_line_failure(r, "in use by another growmem process")
        assert not (tmp_path / "o2" / "metrics.json").exists()
        assert first.poll() is None                        # the first run was left alone
    finally:
        first.kill()
        first.wait()


# ---------------------------------------------------------------------------- 2. non-finite values

def _net(kernel="weighted_softmax", **kw):
    hyper = {"eta": 1.0, "beta": 1.0} if kernel == "weighted_softmax" else {"eta": 0.1}
    return gm.ResidualGrowingNet(d_out=3, n_blocks=1, readout=gm.GrowingSpec.make(kernel, **hyper, **kw))


@pytest.mark.parametrize("bad", ["nan_pixel", "inf_pixel", "nan_target"])
def test_non_finite_candidates_never_enter_a_memory(bad):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.normal(size=(8, 3)).astype(np.float32)
    if bad == "nan_pixel":
        x[2, 1] = np.nan
    elif bad == "inf_pixel":
        x[5, 0] = np.inf
    else:
        y[4, 2] = np.nan
    for pol in (None, policies.chain(policies.novelty(0.1), policies.capacity(100, "evict_smallest"))):
        tr = gm.Trainer(_net("rbf"), loss="squared_error", sample_input=x[:1], policy=pol)
        before = tr.rows_in_use()
        m = tr.step(x, y)
        assert int(m["dropped_rows"]) >= 1                         # the bad sample's rows, in every layer
        for mem in tr.memories().values():
            rows = mem.rows()
            assert all(np.isfinite(rows[f]).all() for f in ("w", "k", "v")), bad
        after = tr.rows_in_use()
        # the other 7 samples enter every layer, with or without the policy (τ = 0.1 is far below the
        # distances between these random inputs and the cap of 100 is not reached)
        assert {k: after[k] - before[k] for k in after} == {k: 8 - 1 for k in after}, (bad, pol)
        assert np.isfinite(np.asarray(tr.predict(x[[0, 1, 3]]))).all()


def test_a_non_finite_loss_stops_the_loop_before_a_checkpoint_naming_the_step():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(10 * 8, 5)).astype(np.float32)
    y = rng.integers(0, 3, 10 * 8)
    x[6 * 8 + 3] = np.nan                                      # a bad image in step 7
    tr = gm.Trainer(_net(), sample_input=x[:8])
    saved = []
    batches = lambda step: (x[(step - 1) * 8:step * 8], y[(step - 1) * 8:step * 8])
    with pytest.raises(NonFiniteLossError, match=r"at step 7 \(last finite loss: [0-9.e+-]+ at step 6\)"):
        fit(tr, batches, steps=10, checkpoint=saved.append, every=5)
    assert saved == [5]                                         # nothing saved after the bad step
    tr = gm.Trainer(_net(), sample_input=x[:8])
    out = fit(tr, batches, steps=10, on_nonfinite="skip")
    assert out["nonfinite_steps"] == 1 and out["step"] == 10
    for mem in tr.memories().values():
        assert np.isfinite(mem.rows()["k"]).all()


def test_an_empty_batch_is_refused_before_it_touches_the_memory():
    x = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    tr = gm.Trainer(_net(), sample_input=x)
    tr.step(x, np.arange(8) % 3)
    before = {p: m.rows() for p, m in tr.memories().items()}
    with pytest.raises(ValueError, match="the batch is empty"):
        tr.step(x[:0], np.zeros(0, np.int64))
    for p, m in tr.memories().items():
        assert m.size == before[p]["k"].shape[0] and np.array_equal(m.rows()["k"], before[p]["k"])


def test_inputs_or_targets_of_another_shape_are_refused_naming_both_shapes():
    x = np.zeros((4, 6), np.float32)
    tr = gm.Trainer(gm.ResidualGrowingNet(d_out=2, n_blocks=0, readout=gm.GrowingSpec.make("rbf", eta=0.1)),
                    loss="squared_error", sample_input=x)
    with pytest.raises(ValueError, match=r"inputs have shape \(5,\) per sample but the model was built for \(6,\)"):
        tr.step(np.zeros((4, 5), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"targets have shape \(3,\) per sample but the model outputs 2 values"):
        tr.step(x, np.zeros((4, 3), np.float32))
    tr.step(x, np.zeros((4, 2), np.float32))                    # the right shapes train
    assert tr.rows_in_use()["readout"] == 4


def test_an_empty_dataset_is_named_as_such_not_as_a_batch_size_range():
    from growmem.train import Batches

    with pytest.raises(ValueError, match=r"the dataset is empty \(0 samples\)"):
        Batches(np.zeros((0, 5), np.float32), np.zeros(0, np.int64), 4)
    with pytest.raises(ValueError, match="5 inputs but 4 targets"):
        Batches(np.zeros((5, 5), np.float32), np.zeros(4, np.int64), 4)
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, 5\], got 6"):
        Batches(np.zeros((5, 5), np.float32), np.zeros(5, np.int64), 6)


def test_labels_outside_the_classes_are_refused_at_the_data_boundary():
    x = np.zeros((4, 5), np.float32)
    tr = gm.Trainer(_net(), sample_input=x)
    for labels, bad in (([0, 1, 2, -1], "label -1"), ([0, 3, 1, 1], "label 3"), ([0, 200, 1, 1], "label 200")):
        with pytest.raises(ValueError, match=f"{bad} is outside the model's 3 classes"):
            tr.step(x, np.asarray(labels))
    with pytest.raises(ValueError, match="integer class labels"):
        tr.step(x, np.zeros(4, np.float32))
    assert all(n == 0 for n in tr.rows_in_use().values())      # nothing entered


def test_temperatures_and_sizes_the_kernels_cannot_use_are_clear_errors():
    q, k, v, w = [[1.0, 2.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0], [2.0]], [1.0, 1.0]   # Python lists work
    np.testing.assert_allclose(np.asarray(kernels.weighted_softmax(q, k, v, w, temperature=1.0)),
                               [[(np.exp(1 / np.sqrt(2)) + 2 * np.exp(2 / np.sqrt(2)))
                                 / (np.exp(1 / np.sqrt(2)) + np.exp(2 / np.sqrt(2)))]], rtol=1e-5)
    for t in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature must be"):
            kernels.weighted_softmax(q, k, v, w, temperature=t)
        with pytest.raises(ValueError, match="temperature must be"):
            kernels.rbf(q, k, v, temperature=t)
    with pytest.raises(ValueError, match="size"):
        kernels.linear(q, k, v, size=-1)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 1e-06"):
        gm.GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, temperature=1e-300)


# ---------------------------------------------------------------------------- 3-6. the command

def _mnist_dir(tmp_path, damage):
    """A folder with the four MNIST files, the training labels or images damaged."""
    d = tmp_path / f"mnist-{damage}"
    d.mkdir()

    def idx(arr, code):
        header = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
        return header + arr.tobytes()

    rng = np.random.default_rng(0)
    imgs = {"train": rng.integers(0, 256, (64, 28, 28), dtype=np.uint8),
            "t10k": rng.integers(0, 256, (16, 28, 28), dtype=np.uint8)}
    labels = {"train": rng.integers(0, 10, 64).astype(np.uint8), "t10k": rng.integers(0, 10, 16).astype(np.uint8)}
    files = {}
    for split in ("train", "t10k"):
        files[f"{split}-images-idx3-ubyte.gz"] = gzip.compress(idx(imgs[split], 0x08))
        files[f"{split}-labels-idx1-ubyte.gz"] = gzip.compress(idx(labels[split], 0x08))
    name = "train-labels-idx1-ubyte.gz"
    if damage == "truncated":
        files["train-images-idx3-ubyte.gz"] = files["train-images-idx3-ubyte.gz"][:200]
    elif damage == "random":
        files["train-images-idx3-ubyte.gz"] = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    elif damage == "not_gzip":
        files[name] = idx(labels["train"], 0x08)[:-3] + b"xyz"
    elif damage == "labels_length":
        files[name] = gzip.compress(idx(labels["train"][:50], 0x08))
    elif damage == "label_200":
        lab = labels["train"].copy()
        lab[::7] = 200
        files[name] = gzip.compress(idx(lab, 0x08))
    for n, b in files.items():
        (d / n).write_bytes(b)
    return d


def _cases(tmp_path):
    only = tmp_path / "only.toml"
    only.write_text('description = "only a description"\n')
    binary = tmp_path / "binary.toml"
    binary.write_bytes(np.random.default_rng(1).integers(0, 256, 400, dtype=np.uint8).tobytes())
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    out = ["--out", tmp_path / "out"]
    cases = [(["--temperature", v], "--temperature") for v in ("0", "-1", "nan")]
    cases += [(["--momentum", "1.5"], "--momentum"), (["--blocks", "-1"], "--blocks"), (["--keep", "0"], "--keep"),
              (["--checkpoint-every", "0"], "--checkpoint-every"), (["--eta", "nan"], "--eta"),
              (["--beta", "inf"], "--beta"), (["--policy", only], "needs the hyperparameters"),
              (["--policy", binary], "not valid TOML"), (["--policy", "/no/such/dir/capped.toml"], "no such preset file"),
              (["--task", "mnist", "--data-dir", tmp_path / "nowhere"], "does not exist"),
              (["--policy", "target_dct"], "growmem continual --policy target_dct"),
              (["--ram-budget", "0"], "must be a positive number of bytes"), (["--ram-budget", "-1MB"], "cannot read '-1MB'"),
              (["--ram-budget", "15.7XB"], "cannot read"), (["--seed", str(2 ** 64)], "--seed"),
              (["--seed", str(2 ** 63 - 1)], "--seed"), (["--seed", "-1"], "--seed")]
    cases = [(c + out, m) for c, m in cases]
    cases += [(["--task", "mnist", "--data-dir", _mnist_dir(tmp_path, d)] + out, None)
              for d in ("truncated", "random", "not_gzip", "labels_length", "label_200")]
    cases += [(["--out", a_file], "is a file")]
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
        cases += [(["--out", tmp_path / "ro" / "o"], "not writable")]
    else:
        cases += [(["--out", "/proc/growmem-out"], "not writable")]
    return cases


def test_bad_command_lines_and_inputs_are_one_line_errors_that_leave_nothing_behind(tmp_path):
    for args, match in _cases(tmp_path):
        r = run("train", *SMALL, *args, "--checkpoint-dir", tmp_path / "ck")
        one_line_failure(r, match, code=2)
        assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir()), args
        assert not (tmp_path / "out").exists(), args           # not even an empty --out folder


def test_a_ram_budget_too_small_and_a_bad_kernel_variable_are_one_line_and_touch_nothing(tmp_path):
    """Refusals that need the model (the rows a budget holds) or the environment, not the parser: one line,
    exit 1, no --out, checkpoint or spill folder left behind."""
    for env, args, match in (({}, ["--ram-budget", "1B"], "RAM budget 1 B is too small"),
                             ({}, ["--ram-budget", "100KB"], "is too small"),
                             ({"GROWMEM_KERNELS": "bogus"}, [], "GROWMEM_KERNELS='bogus'"),
                             ({"GROWMEM_NATIVE_THREADS": "-2"}, [], "GROWMEM_NATIVE_THREADS='-2'")):
        r = subprocess.run([*GROWMEM, "train", *SMALL, *args, "--spill-dir", str(tmp_path / "sp"), "--out",
                            str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ck")],
                           env={**ENV, **env}, capture_output=True, text=True, timeout=300)
        one_line_failure(r, match, code=1)
        for folder in ("sp", "out", "ck"):
            assert not (tmp_path / folder).exists() or not any((tmp_path / folder).iterdir()), (args, env, folder)


def test_a_run_killed_after_its_last_checkpoint_writes_its_results_on_resume(tmp_path):
    """The last checkpoint was written, the results were not (the process died in between): resuming with
    the same --steps trains nothing and writes them, as the uninterrupted run did."""
    ck = tmp_path / "ck"
    assert run("train", *SMALL, "--checkpoint-dir", ck, "--out", tmp_path / "o").returncode == 0
    done = json.loads((tmp_path / "o" / "metrics.json").read_text())
    (tmp_path / "o" / "metrics.json").unlink()
    r = run("train", *SMALL, "--checkpoint-dir", ck, "--resume", "--out", tmp_path / "o")
    assert r.returncode == 0 and "the run had reached --steps 6" in r.stdout, r.stderr
    again = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert (again["final_test_loss"], again["rows"], again["test_curve"]) == \
        (done["final_test_loss"], done["rows"], done["test_curve"])


def test_resume_past_the_end_and_a_damaged_latest_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    assert run("train", "--steps", "40", "--checkpoint-every", "10", "--checkpoint-dir", ck, "--out",
               tmp_path / "o").returncode == 0
    one_line_failure(run("train", "--steps", "30", "--checkpoint-dir", ck, "--resume", "--out", tmp_path / "o"),
                     "already past --steps 30", code=2)
    victim = sorted((ck / "40" / "host").glob("*readout_k.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:len(victim.read_bytes()) // 2])
    one_line_failure(run("inspect", ck), "truncated", code=1)              # inspect verifies the checksums
    err = one_line_failure(run("train", "--steps", "60", "--checkpoint-dir", ck, "--resume", "--out", tmp_path / "o"),
                           "step 40", code=2)
    assert "resume from it with --resume --resume-step 30" in err
    r = run("train", "--steps", "60", "--checkpoint-dir", ck, "--resume", "--resume-step", "30", "--out",
            tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert "removed the later checkpoints [40]" in r.stdout
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit())[-1] == 60


def test_a_failed_save_leaves_no_temporary_folder_and_names_the_last_good_checkpoint(tmp_path, monkeypatch):
    from growmem.checkpoint import CheckpointError, Checkpointer, manager

    tr = gm.Trainer(_net(), sample_input=np.zeros((4, 5), np.float32))
    c = Checkpointer(tmp_path / "ck")
    c.save(tr, 1)
    handler = manager.handlers()[0]
    real = handler.save

    def disk_full(self, directory, args):
        real(self, directory, args)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(handler, "save", disk_full)
    with pytest.raises(CheckpointError, match="the disk is full.*last good checkpoint is step 1"):
        c.save(tr, 2)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name != ".growmem.lock") == ["1"]
    c.close()


def test_ctrl_c_stops_at_the_end_of_a_step_saves_and_resumes_exactly(tmp_path):
    common = ["--eval-every", "100", "--checkpoint-every", "100", "--out", tmp_path / "o", "--steps", "800"]
    victim = subprocess.Popen([*GROWMEM, "train", *map(str, common), "--checkpoint-dir", str(tmp_path / "ck")],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1200):   # past the compilations and the first checkpoint: inside the training loop
        if (tmp_path / "ck").is_dir() and any(p.name.isdigit() for p in (tmp_path / "ck").iterdir()):
            break
        time.sleep(0.1)
    victim.send_signal(signal.SIGINT)
    out, err = victim.communicate(timeout=300)
    assert victim.returncode == 130, err[-2000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    step = int(err.split("interrupted at step ")[1].split(";")[0])
    assert "resume with" in err and (tmp_path / "ck" / str(step)).exists()
    r = run("train", *common, "--checkpoint-dir", tmp_path / "ck", "--resume")
    assert r.returncode == 0 and f"resumed from step {step}" in r.stdout, r.stderr
    resumed = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert run("train", *common[:-4], "--out", tmp_path / "ref", "--steps", "800").returncode == 0
    ref = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    assert resumed["rows"] == ref["rows"] and resumed["final_test_loss"] == ref["final_test_loss"]


def test_full_disks_are_one_line_errors_naming_the_last_good_checkpoint(tmp_path, small_tmpfs):
    mnt = small_tmpfs("600k")
    r = run("train", "--steps", "200", "--checkpoint-every", "20", "--checkpoint-dir", mnt / "ck", "--out",
            tmp_path / "o")
    err = one_line_failure(r, "the disk is full", code=1)
    assert "last good checkpoint is step" in err
    left = [p.name for p in (mnt / "ck").iterdir() if p.name not in (".growmem.lock", ".growmem-run.json")]
    assert all(n.isdigit() for n in left), left               # no half-written temporary step folder
    spill = small_tmpfs("200k")
    r = run("train", "--steps", "200", "--ram-budget", "256KB", "--spill-dir", spill / "S", "--out", tmp_path / "o2")
    one_line_failure(r, "No space left", code=1)
    # export into a full disk: no partial file
    assert run("train", *SMALL, "--checkpoint-dir", tmp_path / "ck", "--out", tmp_path / "o3").returncode == 0
    full = small_tmpfs("8k")
    one_line_failure(run("export", tmp_path / "ck", "--npz", full / "rows.npz"), "disk is full", code=1)
    assert [p.name for p in full.iterdir()] == []


def test_export_targets_that_cannot_be_written(tmp_path):
    assert run("train", *SMALL, "--checkpoint-dir", tmp_path / "ck", "--out", tmp_path / "o").returncode == 0
    one_line_failure(run("export", tmp_path / "ck", "--npz", tmp_path / "no" / "such" / "x.npz"), "does not exist")
    one_line_failure(run("export", tmp_path / "ck", "--npz", tmp_path), "is a folder")
    if os.geteuid() == 0:   # root may write anywhere but /proc
        one_line_failure(run("export", tmp_path / "ck", "--npz", "/proc/growmem.npz"), "failed")
        assert not Path("/proc/growmem.npz").exists()
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        one_line_failure(run("export", tmp_path / "ck", "--npz", tmp_path / "ro" / "x.npz"), "not writable")
    r = run("export", tmp_path / "ck", "--npz", tmp_path / "noext")
    assert r.returncode == 0 and f"wrote {tmp_path / 'noext'} " in r.stdout
    assert (tmp_path / "noext").is_file() and (tmp_path / "noext.json").is_file()
    assert "readout/k" in np.load(tmp_path / "noext").files


def test_a_failed_export_leaves_the_files_it_would_replace_as_they_were(tmp_path, monkeypatch):
    """The disk fills up while the second of the two files is written: the earlier export under the same
    name (npz and JSON) is still there, byte for byte, and no temporary file is left."""
    import importlib

    ins = importlib.import_module("growmem.checkpoint.inspect")   # the package's `inspect` is a function
    assert run("train", *SMALL, "--checkpoint-dir", tmp_path / "ck", "--out", tmp_path / "o").returncode == 0
    target = tmp_path / "rows.npz"
    ins.export(tmp_path / "ck", target)
    before = {p.name: p.read_bytes() for p in (target, Path(f"{target}.json"))}
    calls = []
    real = os.fsync

    def full_on_second(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(ins.os, "fsync", full_on_second)
    with pytest.raises(CheckpointError, match="the disk is full.*nothing was written"):
        ins.export(tmp_path / "ck", target)
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in (target, Path(f"{target}.json"))} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["rows.npz", "rows.npz.json"]


def test_bad_samples_marks_a_sample_bad_in_every_layer_when_one_of_its_rows_is_not_finite():
    from growmem.train import bad_samples
    # B = 3; layer a: one row per input; layer b: two rows per input (a transformer's tokens);
    # layer c: 5 rows, not a multiple of B (left out)
    a = np.array([True, True, False])
    b = np.array([True, True, False, True, True, True])
    c = np.array([False] * 5)
    got = np.asarray(bad_samples([jnp.asarray(a), jnp.asarray(b), jnp.asarray(c)], 3))
    want = ~a | ~b.reshape(3, 2).all(axis=1)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [False, True, True])


def test_a_budget_and_a_temperature_are_refused_by_one_rule_at_every_entry_point(tmp_path):
    """issue 28: the memory budget and the kernel temperature each have one rule (growmem.units), which the
    API's constructors, the preset schema and the commands all apply: the same values are refused with the
    same words, and the same sizes accepted as the same byte counts."""
    from growmem import config, keyspaces, nadaraya, order_free, units
    from growmem.backends.tiered import Tiered
    from growmem.continual.learner import GrowmemLearner
    from growmem.errors import ConfigError
    from growmem.app.options import _size

    budget = {
        "units.byte_budget": lambda b: units.byte_budget(b),
        "TargetMemory": lambda b: nadaraya.TargetMemory(keyspaces.Identity(4), 2, temperature=1.0,
                                                        budget_bytes=b).budget_bytes,
        "NCM": lambda b: order_free.NCM(keyspaces.Identity(4), 2, budget_bytes=b).budget_bytes,
        "Tiered": lambda b: Tiered(tmp_path / "cold", ram_budget_bytes=b).ram_budget_bytes,
        "GrowmemLearner": lambda b: GrowmemLearner(num_classes=2, budget_bytes=b).budget_bytes,
    }
    for name, make in budget.items():
        for bad in (0, -5, 1.5, "0MB", "12XB", True, float("nan"), float("inf"), [1]):
            with pytest.raises(ConfigError, match="must be a positive number of bytes|cannot read"):
                make(bad)
        for good, n in ((4096, 4096), (np.int64(4096), 4096), (3e6, 3_000_000), ("1.5MB", 1_500_000)):
            got = make(good)
            assert got == n and type(got) is int, (name, good, got)
    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive number of bytes"):
        _size("0")
    assert _size("1.5MB") == 1_500_000

    temperature = {
        "units.check_temperature": lambda t: units.check_temperature(t),
        "GrowingSpec": lambda t: gm.GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, temperature=t),
        "TargetMemory": lambda t: nadaraya.TargetMemory(keyspaces.Identity(4), 2, temperature=t),
        "kernels.rbf": lambda t: kernels.rbf([[1.0, 0.0]], [[1.0, 0.0]], [[1.0]], temperature=t),
    }
    for name, make in temperature.items():
        for bad in (0.0, -1.0, 1e-7, float("nan"), float("inf"), True):
            with pytest.raises(ConfigError, match=f"temperature must be a finite number >= {units.MIN_TEMPERATURE}"):
                make(bad)
        make(units.MIN_TEMPERATURE)
        make(2.0)
    # the preset schema: the same bound, named with the file and the key
    preset = tmp_path / "p.toml"
    preset.write_text('description = "t"\n[target]\ntemperature = 1e-7\n[keys]\nkind = "identity"\n')
    with pytest.raises(ConfigError, match=f"'target.temperature' = 1e-07 is not allowed; allowed: a finite number "
                                          f">= {units.MIN_TEMPERATURE}"):
        config.load(preset)
    preset.write_text('description = "t"\n[target]\ntemperature = 0.5\nbudget = "0MB"\n[keys]\nkind = "identity"\n')
    with pytest.raises(ConfigError, match="'target.budget' = '0MB' is not allowed"):
        config.load(preset)
    preset.write_text('description = "t"\n[target]\ntemperature = 1e-6\nbudget = "1.5MB"\n[keys]\nkind = "identity"\n')
    assert config.load(preset).budget_bytes == 1_500_000
