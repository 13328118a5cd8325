"""Chaos: a spilling training run SIGKILLed at random points, resumed each time, ends bitwise where an
uninterrupted run ends; nothing half-written is left.

The run (``growmem train --ram-budget``: rows past the budget spill to a TensorStore cold tier, a
checkpoint every few steps) is killed at ``KILLS`` moments drawn from a seeded generator (the seed is
printed: ``GROWMEM_CHAOS_SEED`` replays a failure), spread over the whole run, so kills land during
spills, during checkpoint writes and between a tier's manifest and its chunks. After each kill the same
command is run again with ``--resume``; at the end its metrics, its rows (``growmem export``) and every
cold-tier chunk file equal the uninterrupted run's, and no temporary file or folder remains.

The 1-process run is killed in the runs that resume from the faults below (``KILLS`` in each), so
the kills start from a folder a fault left behind. The same for a 2-process run (``--coordinator``:
every memory's rows split over the two processes' devices, each shard spilling to its own cold tier),
both processes killed at once at ``KILLS2`` points.
The 1-process runs take fewer: the 2-process one goes through the same tier code and more.

Faults, not only kills: a file-size limit (``RLIMIT_FSIZE``: a disk that fills) in the middle of a
checkpoint write; a full disk (``ENOSPC``) between a spill's chunks and its manifest, and, in the run
resumed from it, a checkpoint folder turned read-only (``EROFS``) while a step is committed. Each fails
the run with one line naming the folder; the previous checkpoint stays valid and the run resumes from it
(killed at ``KILLS`` random points on the way) to the uninterrupted result.

The killed runs are forked from one warm interpreter (``tests/forked.py``: the imports done once, nothing
run before the fork), so a restart costs the run's own start — the checkpoint and cold tier read back, the
coordinator joined, the programs loaded from the compilation cache — not the imports of jax, orbax and
tensorstore; a fault's run is forked too, its fault set up by a prologue before the command runs."""
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import forked
from growmem.locks import written_by

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("chaos")]   # one reference run, one worker

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
#: kills of the 1-process run in each fault case's resume (two cases: 4 in all)
KILLS = 2
RUN = ["--steps", "144", "--batch-size", "32", "--test-size", "64", "--eval-every", "144", "--blocks", "1",
       "--ram-budget", "1MB", "--checkpoint-every", "3", "--keep", "2"]
#: names of what an interrupted write leaves behind (Orbax's temporary step folders, growmem's temporaries)
TEMPORARY = ("tmp", ".part", ".growmem-export-", "write-probe")


#: a prologue per fault, run before growmem's CLI in the faulty (forked) process (``{ck}``: the checkpoint
#: folder; ``{after}``: a step past the last good checkpoint)
FSIZE = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
         "resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))", "saving step")
# the 4th manifest write of the cold tiers (after that spill's chunks were written) finds the disk full
ENOSPC = ("import errno; from growmem.backends import tiered; w = tiered.ColdTier._write_manifest; n = [0]\n"
          "def full(kv, m):\n    n[0] += 1\n    if n[0] == 4: raise OSError(errno.ENOSPC, 'No space left on device')\n"
          "    return w(kv, m)\n"
          "tiered.ColdTier._write_manifest = staticmethod(full)", "spilling")
# the checkpoint folder turns read-only (the machine runs as root, so chmod would not refuse: the fault is
# injected where Orbax commits a step, its renames) once the resumed run saves step {after} or later
EROFS = ("import errno, os, re\n"
         "def ro(real):\n"
         "    def f(src, dst, *a, **k):\n"
         "        m = re.match(r'(\\d+)(\\.|/|$)', os.path.relpath(str(dst), '{ck}'))\n"
         "        if m and int(m.group(1)) >= {after}: raise OSError(errno.EROFS, 'Read-only file system', str(dst))\n"
         "        return real(src, dst, *a, **k)\n"
         "    return f\n"
         "os.rename, os.replace = ro(os.rename), ro(os.replace)", "saving step")
#: each case: the faults met one after the other (each run resumes the last one's folder), then a clean resume
FAULTS = {
    # the checkpoint's host arrays pass 150 kB at a few hundred rows; the cold chunks (100 kB) still fit
    "checkpoint write past a file-size limit": [FSIZE],
    "disk full between a spill's chunks and its manifest, then a read-only folder mid-checkpoint": [ENOSPC, EROFS],
}


def _args(ck, out, resume):
    return ["train", *RUN, "--checkpoint-dir", str(ck), "--out", str(out)] + (["--resume"] if resume else [])


@pytest.fixture(scope="session")
def forks():
    """The warm interpreter the killed runs are forked from: the worker's one for this environment (the
    hardening tests' CLI runs share it), ended when the worker exits."""
    return forked.shared(ENV)


def _chunks(ck: Path) -> dict:
    """``{path: bytes}`` of every chunk file of the cold tiers (the manifests name the run, so differ)."""
    return {str(p.relative_to(ck)): p.read_bytes() for p in sorted((ck / "cold").rglob("*"))
            if p.is_file() and "/c/" in str(p.relative_to(ck))}


def _export(forks, ck: Path, npz: Path) -> dict:
    p = forks.launch(["export", str(ck), "--npz", str(npz)])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    z = np.load(npz)
    return {k: z[k] for k in z.files if k != "__description__"}


def _latest(ck: Path) -> int:
    """The newest complete checkpoint step in ``ck`` (Orbax renames a step's folder into place when it is
    complete), 0 for none."""
    try:
        return max((int(p.name) for p in ck.iterdir() if p.name.isdigit()), default=0)
    except FileNotFoundError:
        return 0


def _watch(proc, ck: Path, kill_after=None):
    """Poll ``proc`` (a process, or the processes of one distributed run) and ``ck``: ``(killed, times of
    each new checkpoint since launch, stderr)``; ``kill_after(elapsed, times)`` returns True to SIGKILL
    them all now."""
    procs = proc if isinstance(proc, list) else [proc]
    t0, base, times = time.monotonic(), _latest(ck), []
    while any(p.poll() is None for p in procs):
        now = time.monotonic() - t0
        latest = _latest(ck)
        if latest > base:
            times.append(now)
            base = latest
        if kill_after is not None and kill_after(now, times):
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.communicate()
            return True, times, ""
        time.sleep(0.01)
    return False, times, "\n----\n".join(p.communicate()[1] for p in procs)


@pytest.fixture(scope="session")
def reference(tmp_path_factory, forks):
    """The uninterrupted run: ``(checkpoint folder, out folder, times of its checkpoints)``. Once per worker
    (session scope); the module's ``xdist_group`` puts its users on one worker — but under pytest 9.2 with
    pytest-xdist 3.8 the group is silently ignored (pytest-xdist#1386) and each worker makes its own."""
    d = tmp_path_factory.mktemp("reference")
    proc = forks.launch(_args(d / "ref", d / "oref", False))
    _, times, err = _watch(proc, d / "ref")
    assert proc.returncode == 0 and len(times) > 2, (times, err[-2000:])
    return d / "ref", d / "oref", times, _export(forks, d / "ref", d / "ref.npz")


def _same_as_reference(forks, reference, ck, out, tmp_path, why):
    """The run in ``ck`` / ``out`` ended where the reference did: metrics, exported rows, cold chunks, and
    no temporary left."""
    ref, oref, _, ra = reference
    a = json.loads((oref / "metrics.json").read_text())
    b = json.loads((out / "metrics.json").read_text())
    assert (a["final_test_loss"], a["rows"]) == (b["final_test_loss"], b["rows"]), why
    rb = _export(forks, ck, tmp_path / "b.npz")
    assert ra.keys() == rb.keys() and all(ra[k].tobytes() == rb[k].tobytes() for k in ra), why
    assert _chunks(ref) == _chunks(ck), why
    assert _chunks(ck), "the run never spilled: raise the steps or lower the budget"
    left = [str(p.relative_to(ck)) for p in ck.rglob("*") if any(t in p.name for t in TEMPORARY)]
    assert left == [], (why, left)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_mid_run_fails_in_one_line_and_the_last_checkpoint_resumes(forks, reference, tmp_path, fault):
    ck, out = tmp_path / "ck", tmp_path / "o"
    for prologue, says in FAULTS[fault]:
        before = _latest(ck)
        prologue = prologue.replace("{ck}", str(ck)).replace("{after}", str(before + 6))
        r = forks.launch(_args(ck, out, before > 0), prologue=prologue)
        _, err = r.communicate(timeout=600)
        assert r.returncode == 1, (fault, says, err[-2000:])
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"growmem train: {says}") and str(ck) in last and "Traceback" not in err, err
        assert before < _latest(ck) < 144, (fault, says, before, _latest(ck))   # mid-run, after a new good checkpoint
    seed = _seed()
    kills = _kill_and_resume(lambda resume: [forks.launch(_args(ck, out, resume))], ck, reference[2], seed, KILLS)
    final = forks.launch(_args(ck, out, True))
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, (fault, seed, kills, err[-2000:])
    print(f"{len(kills)} kills (checkpoint step before each, share of the wait): {kills}")
    assert len(kills) >= KILLS, (seed, kills, "the run ended before every kill point: give it more steps")
    _same_as_reference(forks, reference, ck, out, tmp_path, (fault, seed, kills))


def _kill_and_resume(launch, ck: Path, times, seed: int, kills_wanted: int):
    """Start ``launch(resume)`` (the run's processes) and SIGKILL them at random points until ``kills_wanted`` kills (or it ends),
    resuming each time; ``times``: the reference's checkpoint times. Returns the kills."""
    rng = np.random.default_rng(seed)
    startup, interval = times[0], float(np.median(np.diff(times)))     # one checkpoint's worth of steps
    kills = []
    while len(kills) < kills_wanted:
        # --resume once the folder holds the run (its marker), checkpoint or not: a run killed before its
        # first checkpoint is resumed from the start, as a user would
        victim = launch(written_by(ck) == "train")
        u = float(rng.uniform())
        if rng.uniform() < 0.25:        # while it starts: reading the checkpoint and the cold tier back (a start
            rule = lambda now, t, u=u: now > u * startup or bool(t)    # faster than the reference's: at its first)
        else:                           # after one new checkpoint, anywhere in the next interval: a step, a spill,
            rule = lambda now, t, u=u: bool(t) and (len(t) > 1 or now > t[0] + u * interval)   # or a checkpoint
        killed, _, err = _watch(victim, ck, rule)
        if not killed:
            assert [p.returncode for p in victim] == [0] * len(victim), (seed, kills, err[-3000:])
            break
        kills.append((_latest(ck), round(u, 2)))
    return kills


def _seed() -> int:
    seed = int(os.environ.get("GROWMEM_CHAOS_SEED", time.time_ns() % 2 ** 31))
    print(f"chaos seed {seed} (GROWMEM_CHAOS_SEED={seed} replays it)")
    return seed


# ----------------------------------------------------------------------------- two processes

#: a 2-process run (``jax.distributed`` on localhost, every memory's rows split over the processes' devices,
#: each shard spilling to its own cold tier past the budget)
RUN2 = ["--steps", "120", "--batch-size", "32", "--test-size", "64", "--eval-every", "120", "--blocks", "1",
        "--ram-budget", "1MB", "--checkpoint-every", "3", "--keep", "2"]
#: kills of both processes of the 2-process run (a restart starts two interpreters and the coordinator; each
#: loads its compiled programs from its own persistent cache: the cold reads name no Python callback)
KILLS2 = 16
#: kill points per CI run, both groups together: the floor the chaos suite promises
assert KILLS2 + KILLS * len(FAULTS) >= 20


def _launch2(forks, ck: Path, out: Path, resume: bool, xla: Path):
    """Both processes of the run; each with a compilation cache of its own in ``xla`` (JAX writes its cache from
    process 0 only: process 1 would compile its programs again at every restart, ~6 s of each)."""
    from conftest import coordinator_port

    port = coordinator_port()
    return [forks.launch(["train", *RUN2, "--checkpoint-dir", str(ck), "--out", str(out), "--coordinator",
                          f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)]
                         + (["--resume"] if resume else []), cache=xla / f"process-{i}") for i in range(2)]


@pytest.mark.xdist_group("chaos_two_processes")   # its own reference: may run beside the 1-process group
def test_a_two_process_spilling_run_killed_at_random_points_resumes_to_the_uninterrupted_result(forks, tmp_path):
    """Both processes SIGKILLed at once (a host lost), at random points — during a start, a step, the
    collectives of a spill or a checkpoint — then both resumed: the final metrics and every shard's cold
    chunks are those of an uninterrupted 2-process run, and nothing half-written remains."""
    seed = _seed()
    ref, oref = tmp_path / "ref", tmp_path / "oref"
    procs = _launch2(forks, ref, oref, False, tmp_path / "xla")
    _, times, err = _watch(procs, ref)
    assert [p.returncode for p in procs] == [0, 0] and len(times) > 2, (times, err[-3000:])
    ck, out = tmp_path / "ck", tmp_path / "o"
    kills = _kill_and_resume(lambda resume: _launch2(forks, ck, out, resume, tmp_path / "xla"), ck, times, seed,
                            KILLS2)
    final = _launch2(forks, ck, out, True, tmp_path / "xla")
    killed, _, err = _watch(final, ck)
    assert [p.returncode for p in final] == [0, 0], (seed, kills, err[-3000:])
    print(f"{len(kills)} kills of both processes (checkpoint step before each, share of the wait): {kills}")
    assert len(kills) >= KILLS2, (seed, kills, "the run ended before every kill point: give it more steps")
    a, b = (json.loads((o / "metrics.json").read_text()) for o in (oref, out))
    assert (a["final_test_loss"], a["rows"]) == (b["final_test_loss"], b["rows"]), (seed, kills)
    # every row counted, hot and cold, on both processes' shards: D0 = one batch, then a row per sample
    assert a["rows"] == {"block_0": 32 * 121, "readout": 32 * 121}, a["rows"]
    assert _chunks(ref) == _chunks(ck), (seed, kills)
    assert {p.split("/")[2] for p in _chunks(ck)} == {"shard-0", "shard-1"}, "both shards must spill"
    left = [str(p.relative_to(ck)) for p in ck.rglob("*") if any(t in p.name for t in TEMPORARY)]
    assert left == [], (seed, kills, left)
