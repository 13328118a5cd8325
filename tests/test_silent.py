"""Nothing silent, round 3: a checkpoint folder knows the command that wrote it, ``--resume`` never
starts afresh, two runs never write the same results, a damaged cold tier is an error naming the
file (never rows of zeros), what is not finite never enters a stand-alone store, and usage errors
come before the heavy imports.

Every case runs the real command (or the API) in a subprocess and checks the exit code, one line on
stderr without a traceback, and that the folders involved are unchanged (helpers of
``tests/test_hardening.py``)."""
import json
import subprocess
import sys
import time

import numpy as np

from test_hardening import ENV, GROWMEM, one_line_failure, run, tree

TRAIN = ["--steps", "6", "--batch-size", "8", "--test-size", "32", "--eval-every", "3"]
CONTINUAL = ["--n-experiences", "1", "--train-limit", "32", "--test-limit", "16", "--baselines", "none",
             "--policy", "continual_growmem", "--no-progress", "--threads", "1"]


def _holds_lock(folder, pid) -> bool:
    try:
        return (folder / ".growmem.lock").read_text().strip() == str(pid)
    except OSError:
        return False


def test_checkpoint_folders_know_their_command_and_two_runs_never_share_results(tmp_path):
    C, O, T = tmp_path / "C", tmp_path / "O", tmp_path / "T"
    # a continual run A; while it runs, a second one with the same --out is refused at once (case 4)
    a = subprocess.Popen([*GROWMEM, "continual", *CONTINUAL, "--seeds", "7", "--checkpoint-dir", str(C), "--out",
                          str(O)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if _holds_lock(O, a.pid) or a.poll() is not None:
                break
            time.sleep(0.05)
        assert _holds_lock(O, a.pid), "run A never took its --out"
        b = run("continual", *CONTINUAL, "--seeds", "8", "--checkpoint-dir", tmp_path / "C2", "--out", O)
        one_line_failure(b, f"is in use by another growmem process (pid {a.pid})")
        assert a.poll() is None and not (tmp_path / "C2").exists()
        # meanwhile a train run writes its checkpoint folder T
        assert run("train", *TRAIN, "--checkpoint-dir", T, "--out", tmp_path / "to").returncode == 0
        out, err = a.communicate(timeout=600)
    finally:
        a.kill()
        a.wait()
    assert a.returncode == 0, err[-2000:]
    assert json.loads((O / "continual.json").read_text())["config"]["seeds"] == [7]   # A's results, whole
    runs = {"C": tree(C), "T": tree(T), "O": tree(O)}

    # case 1: --resume over a folder that does not exist (or is empty) stops, creating nothing
    for cmd, extra in (("continual", CONTINUAL), ("train", TRAIN)):
        one_line_failure(run(cmd, *extra, "--resume", "--checkpoint-dir", tmp_path / "nope" / "ckpt", "--out",
                             tmp_path / "o1"), "does not exist, so there is no run to resume", code=2)
        (tmp_path / "empty").mkdir(exist_ok=True)
        one_line_failure(run(cmd, *extra, "--resume", "--checkpoint-dir", tmp_path / "empty", "--out",
                             tmp_path / "o1"), "is empty, so there is no run to resume", code=2)
    assert not (tmp_path / "nope").exists() and not (tmp_path / "o1").exists()
    assert list((tmp_path / "empty").iterdir()) == []
    # cases 2 and 3: a folder written by the other command is refused, resumed or not, naming that command
    for resume in ([], ["--resume"]):
        one_line_failure(run("train", *TRAIN, *resume, "--checkpoint-dir", C, "--out", tmp_path / "o2"),
                         "holds a `growmem continual` run; `growmem train` neither resumes nor writes into it", code=2)
        one_line_failure(run("continual", *CONTINUAL, *resume, "--checkpoint-dir", T, "--out", tmp_path / "o3"),
                         "holds a `growmem train` run; `growmem continual` neither resumes nor writes into it", code=2)
    # a folder of files no growmem command wrote
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    one_line_failure(run("train", *TRAIN, "--checkpoint-dir", tmp_path / "mine", "--out", tmp_path / "o2"),
                     "holds files that no growmem command wrote", code=2)
    # the same command without --resume over its own run: refused too
    one_line_failure(run("continual", *CONTINUAL, "--checkpoint-dir", C, "--out", tmp_path / "o3"),
                     "already holds a `growmem continual` run; pass --resume", code=2)
    assert {"C": tree(C), "T": tree(T), "O": tree(O)} == runs
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_a_damaged_cold_tier_is_an_error_naming_the_file_never_zeros(tmp_path):
    ck = tmp_path / "cks"
    spill = ["--ram-budget", "1MB", "--checkpoint-dir", ck, "--eval-every", "48"]
    assert run("train", "--steps", "48", *spill, "--out", tmp_path / "o").returncode == 0
    r = run("inspect", ck)
    assert r.returncode == 0 and "checksums    verified" in r.stdout, r.stderr
    victim = ck / "cold" / "readout" / "gen-0" / "k" / "c" / "1" / "0"
    good = victim.read_bytes()
    before = tree(ck)
    victim.unlink()                                                     # case 5: a chunk file deleted
    err = one_line_failure(run("inspect", ck), f"chunk file {victim} is missing", code=1)   # case 6
    assert "rows" in err and "of k are lost" in err
    one_line_failure(run("train", "--steps", "50", *spill, "--resume", "--out", tmp_path / "o"),
                     f"chunk file {victim} is missing", code=2)
    damaged = bytearray(good)
    damaged[100] ^= 0x10                                                # one flipped bit
    victim.write_bytes(bytes(damaged))
    one_line_failure(run("export", ck, "--npz", tmp_path / "rows.npz"),
                     f"chunk file {victim} does not match its checksum", code=1)
    victim.write_bytes(good)
    assert tree(ck) == before and not (tmp_path / "rows.npz").exists()  # nothing was cut or rewritten


def test_a_damaged_cold_chunk_points_the_resume_at_a_checkpoint_that_does_not_hold_it(tmp_path):
    """Older checkpoints refer to the same cold chunks up to their own row count: the one the resume suggests
    must verify, and the ones that hold the damaged chunk must not be suggested."""
    ck = tmp_path / "ck"
    spill = ["--ram-budget", "1MB", "--checkpoint-dir", ck, "--eval-every", "48", "--checkpoint-every", "8",
             "--keep", "10"]
    assert run("train", "--steps", "48", *spill, "--out", tmp_path / "o").returncode == 0
    chunks = sorted((ck / "cold" / "readout" / "gen-0" / "k" / "c").iterdir(), key=lambda p: int(p.name))
    victim = chunks[-1] / "0"                                         # the newest cold chunk of readout/k
    damaged = bytearray(victim.read_bytes())
    damaged[50] ^= 0x01
    victim.write_bytes(bytes(damaged))
    err = one_line_failure(run("train", "--steps", "56", *spill, "--resume", "--out", tmp_path / "o"),
                           f"chunk file {victim} does not match its checksum", code=2)
    steps = sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    verifies = {s: run("inspect", ck, "--step", s).returncode == 0 for s in steps}
    assert not verifies[steps[-1]] and any(verifies.values()), verifies
    want = max(s for s, ok in verifies.items() if ok)
    assert f"the newest older checkpoint that verifies (its cold rows included) is step {want}" in err, err
    assert all(not verifies[s] for s in steps if s > want)


USAGE_WORKER = r"""
import contextlib, io, json, sys
from growmem.app.cli import main
cases = [["continual", "--checkpoint-every", "0"], ["continual", "--stream", "mnist"],
         ["continual", "--baselines", "naive,replay"], ["continual", "--seeds", "1,x"],
         ["continual", "--memory-budget", "0"], ["continual", "--resume"],
         ["continual", "--resume", "--checkpoint-dir", sys.argv[1] + "/nope", "--out", sys.argv[1] + "/o"],
         ["train", "--resume", "--checkpoint-dir", sys.argv[1] + "/nope", "--out", sys.argv[1] + "/o"],
         ["train", "--keep", "0"], ["repro", "NOSUCH", "--preset", "smoke"],
         ["continual", "--stream", "split_mnist", "--data-dir", sys.argv[1] + "/nowhere", "--out", sys.argv[1] + "/o"]]
out = []
for argv in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    out.append([argv, code, err.getvalue()])
heavy = sorted(m for m in ("torch", "avalanche", "jax", "tensorstore", "orbax") if m in sys.modules)
print(json.dumps({"cases": out, "heavy": heavy}))
"""


def test_usage_errors_are_one_line_before_torch_avalanche_or_jax_is_imported(tmp_path):
    r = subprocess.run([sys.executable, "-c", USAGE_WORKER, str(tmp_path)], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    want = ["--checkpoint-every: must be a positive integer, got 0", "unknown stream 'mnist'; valid streams",
            "unknown method 'replay'; valid methods", "must be comma-separated integers", "must be a positive number of bytes",
            "--resume needs --checkpoint-dir", "does not exist, so there is no run to resume",
            "does not exist, so there is no run to resume", "--keep: must be an integer >= 1",
            "unknown experiment 'NOSUCH'; the experiments are single-pass, ",
            "the MNIST streams need the MNIST files: mnist: data_dir "]
    for (argv, code, err), match in zip(doc["cases"], want):
        assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, (argv, code, err)
        assert err.startswith(f"growmem {argv[0]}: "), err
    assert doc["heavy"] == [], doc["heavy"]   # (repro NOSUCH needs none of them either)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_continual_run_leaves_no_folder_behind(tmp_path):
    """(``growmem train``'s failures: test_hardening's bad command lines.)"""
    r = run("continual", "--stream", "split_mnist", "--data-dir", tmp_path / "nowhere", "--out",
            tmp_path / "new" / "deep" / "out", "--checkpoint-dir", tmp_path / "new" / "ck")
    one_line_failure(r, "the MNIST streams need the MNIST files", code=2)
    assert not (tmp_path / "new").exists(), sorted((tmp_path / "new").rglob("*"))


STORE_WORKER = r"""
import json, sys
import numpy as np
import growmem as gm
from growmem.keyspaces import Identity, Subspaces
from growmem.nadaraya import TargetMemory
from growmem.store import Store

rng = np.random.default_rng(0)
d, e = 4, 2
spec = gm.GrowingSpec.make("rbf", eta=0.1)
w = rng.random(8).astype(np.float32)
k = rng.normal(size=(8, d)).astype(np.float32)
v = rng.normal(size=(8, e)).astype(np.float32)
k[1, 2], v[3, 0], w[4], k[6, 0] = np.nan, np.inf, -np.inf, -np.inf
store = Store.create(spec, d_in=d, d_out=e)
store.append(w, k, v)
store.append(w[[0, 3]], k[[0, 3]], v[[0, 3]], mask=np.array([True, False]))   # masked out: not counted
q = rng.normal(size=(5, d)).astype(np.float32)
rows = store.rows()
out = {"size": store.size, "dropped": store.dropped_nonfinite, "k": rows["k"].tolist(), "v": rows["v"].tolist(),
       "w": rows["w"].tolist(), "y": np.asarray(store.retrieve(q)).tolist(), "q": q.tolist(),
       "candidates": {"w": w.tolist(), "k": k.tolist(), "v": v.tolist()}, "temperature": spec.temperature}
errors = {}
for name, call in (("from_rows", lambda: Store.from_rows(w, k, v, spec=spec)),
                   ("shape", lambda: store.append(w, k[:, :3], v)),
                   ("observe_identity", lambda: TargetMemory(Identity(10), 3, temperature=1.0).observe(
                       rng.normal(size=(8, 5)), rng.integers(0, 3, 8))),
                   ("observe_subspaces", lambda: TargetMemory(Subspaces(10, dim=2, n_fit=4), 3,
                                                              temperature=1.0).observe(rng.normal(size=(8, 7)),
                                                                                       rng.integers(0, 3, 8)))):
    try:
        call()
        errors[name] = None
    except ValueError as exc:
        errors[name] = str(exc)
out["errors"] = errors
out["size_after"] = store.size
print(json.dumps(out, allow_nan=True))
"""


def test_a_store_never_takes_a_non_finite_row_and_shapes_are_named(tmp_path):
    r = subprocess.run([sys.executable, "-c", STORE_WORKER], env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    c = {f: np.asarray(a, np.float32) for f, a in doc["candidates"].items()}
    finite = np.isfinite(c["w"]) & np.isfinite(c["k"]).all(1) & np.isfinite(c["v"]).all(1)
    assert finite.sum() == 4                                            # the 4 bad candidates of case 7
    assert doc["dropped"] == 4 and doc["size"] == 4 + 1 and doc["size_after"] == 5
    k, v = np.asarray(doc["k"]), np.asarray(doc["v"])
    assert np.isfinite(k).all() and np.isfinite(v).all() and np.isfinite(doc["w"]).all()
    np.testing.assert_array_equal(k, np.concatenate([c["k"][finite], c["k"][[0]]]))   # the finite ones, in order
    # retrieval is finite and is the RBF sum over the finite rows only (Alg. 5, c_i = 1), computed here
    q, y = np.asarray(doc["q"]), np.asarray(doc["y"])
    d2 = ((q[:, None, :] - k[None]) ** 2).sum(-1)
    want = np.exp(-d2 / (2 * doc["temperature"] * np.sqrt(q.shape[1]))) @ v
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    err = doc["errors"]
    assert "4 of the 8 rows are not finite" in err["from_rows"] and "[1, 3, 4, 6]" in err["from_rows"]
    assert "k has shape (8, 3), expected (8, 4)" in err["shape"]
    assert err["observe_identity"] == "inputs have shape (8, 5); the identity key space takes (B, 10) inputs"
    assert err["observe_subspaces"] == "inputs have shape (8, 7); the subspaces key space takes (B, 10) inputs"
