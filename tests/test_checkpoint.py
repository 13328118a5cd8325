"""Orbax checkpoints: exact resume after SIGKILL, atomic saves, keep-k, clear errors, inspect/export."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import growmem as gm
from growmem import checkpoint as ck
from growmem.checkpoint import manager as ck_manager
from growmem.train import Batches
from growmem.train import fit as train_fit

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "resume_worker.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def _spec(**kw):
    return gm.GrowingSpec.make("weighted_softmax", temperature=kw.pop("temperature", 1.0), eta=1.0, beta=1.0,
                               init="random", init_rows=8, **kw)


def _data(n=64, d=8, seed=0):
    rs = np.random.RandomState(seed)
    x = rs.randn(n, d).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _trainer(temperature=1.0, hidden=None, seed=0):
    x, _ = _data()
    model = gm.ResidualGrowingNet(d_out=2, n_blocks=1, readout=_spec(temperature=temperature))
    tx = None
    if hidden:
        model = gm.ResidualMLP(d_out=2, n_blocks=1, hidden=hidden)
        tx = optax.adam(1e-2)
    return gm.Trainer(model, loss="cross_entropy", tx=tx, sample_input=x[:8], rng=jax.random.key(seed))


def fit(trainer, x, y, *, batch_size, steps, rng):
    """Train ``steps`` steps on shuffled mini-batches of (x, y) with the one training loop."""
    return train_fit(trainer, Batches(x, y, batch_size, rng=rng), steps=steps)


def _bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _states_bitwise_equal(s1, s2):
    l1, t1 = jax.tree_util.tree_flatten(s1)
    l2, t2 = jax.tree_util.tree_flatten(s2)
    return t1 == t2 and all(_bits_equal(a, b) for a, b in zip(l1, l2))


def test_resume_after_sigkill_reaches_bitwise_identical_memory_and_predictions(tmp_path):
    steps = 12
    ref_out, out, ckpt = tmp_path / "ref.npz", tmp_path / "resumed.npz", tmp_path / "ckpt"
    # the uninterrupted reference runs concurrently with the run we kill
    ref = subprocess.Popen([sys.executable, WORKER, str(ref_out), str(steps)], env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = subprocess.Popen([sys.executable, WORKER, str(tmp_path / "never.npz"), str(steps), "--ckpt", str(ckpt),
                               "--every", "4", "--sleep", "0.25"], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    seen = []
    try:
        for line in victim.stdout:
            seen.append(line.strip())
            # 6 batches per epoch: checkpoint 8 (epoch 1, batch 2 — mid-epoch) is complete, 12's has not started
            if line.strip() == "step 10":
                victim.send_signal(signal.SIGKILL)
                break
    finally:
        victim.kill()
        victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, seen
    assert not (tmp_path / "never.npz").exists()
    with ck.Checkpointer(ckpt, create=False) as c:
        latest = c.latest_step()
    assert latest == 8
    assert c_meta(ckpt)["data_position"] == {"epoch": 1, "batch": 2}
    res = subprocess.run([sys.executable, WORKER, str(out), str(steps), "--ckpt", str(ckpt), "--every", "4",
                          "--resume"], env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert ref.wait(timeout=300) == 0, ref.stderr.read()[-3000:]
    a, b = np.load(ref_out), np.load(out)
    assert int(b["resumed_from"]) == latest
    assert int(b["step"]) == steps
    assert set(a.files) == set(b.files)
    for key in a.files:
        if key == "resumed_from":
            continue
        assert _bits_equal(a[key], b[key]), key


def c_meta(directory):
    with ck.Checkpointer(directory, create=False) as c:
        return c.read_meta()


def test_roundtrip_restores_params_optimizer_state_memory_rng_and_position(tmp_path):
    x, y = _data()
    t = _trainer(hidden=16)
    for i in range(3):
        t.step(x[:8], y[:8])
    c = ck.Checkpointer(tmp_path / "c", keep=2)
    c.save(t, rng=jax.random.key(42), data_position={"epoch": 1, "batch": 3}, policy={"name": "append_all"})
    t2 = _trainer(hidden=16, seed=5)
    assert not _states_bitwise_equal(t.state, t2.state)
    r = c.restore(t2)
    assert r.step == 3 and r.data_position == {"epoch": 1, "batch": 3} and r.policy == {"name": "append_all"}
    assert _bits_equal(jax.random.key_data(r.rng), jax.random.key_data(jax.random.key(42)))
    assert _states_bitwise_equal(t.state, t2.state)
    # growing memories: rows, size, clock and capacity come back
    g = _trainer()
    fit(g, x, y, batch_size=8, steps=5, rng=jax.random.key(0))
    c.save(g)
    g2 = _trainer(seed=9)
    c.restore(g2)
    assert _states_bitwise_equal(g.state, g2.state)
    assert _bits_equal(g.predict(x), g2.predict(x))
    # the restored trainer keeps training exactly like the original
    g.step(x[:8], y[:8])
    g2.step(x[:8], y[:8])
    assert _states_bitwise_equal(g.state, g2.state)
    c.close()


def test_bfloat16_rows_come_back_as_bfloat16_bit_for_bit(tmp_path):
    """.npy has no bfloat16 dtype: the rows must not come back as raw 2-byte voids."""
    x, y = _data()
    model = gm.ResidualGrowingNet(d_out=2, n_blocks=1, readout=_spec(row_dtype="bfloat16"),
                                  block=_spec(row_dtype="bfloat16"))
    make = lambda seed: gm.Trainer(model, loss="cross_entropy", sample_input=x[:8],  # noqa: E731
                                   rng=jax.random.key(seed))
    g = make(0)
    fit(g, x, y, batch_size=8, steps=4, rng=jax.random.key(0))
    assert g.memories()[("readout",)].k.dtype == jax.numpy.bfloat16
    with ck.Checkpointer(tmp_path / "c") as c:
        c.save(g)
        g2 = make(3)
        c.restore(g2)
    assert _states_bitwise_equal(g.state, g2.state)
    assert _bits_equal(g.predict(x), g2.predict(x))


def test_keeps_only_the_last_k_checkpoints(tmp_path):
    x, y = _data()
    t = _trainer()
    c = ck.Checkpointer(tmp_path / "c", keep=2)
    for i in range(4):
        t.step(x[:8], y[:8])
        c.save(t)
    assert c.all_steps() == [3, 4]
    with pytest.raises(ck.CheckpointError, match="already holds step 4"):
        c.save(t, step=2)
    c.close()


def test_interrupted_save_leaves_previous_checkpoint_loadable(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(HERE)!r})
        import numpy as np, jax
        import growmem as gm
        from growmem import checkpoint as ck
        from orbax.checkpoint._src.path import atomicity
        from test_checkpoint import _trainer, _data
        x, y = _data()
        t = _trainer()
        t.step(x[:8], y[:8])
        c = ck.Checkpointer({str(tmp_path / 'c')!r}, keep=3)
        c.save(t)
        print("saved", flush=True)
        async def die(self, *a, **k):   # the process dies after writing, before the commit rename
            os.kill(os.getpid(), signal.SIGKILL)
        atomicity.AtomicRenameTemporaryPath.finalize = die
        t.step(x[:8], y[:8])
        c.save(t)
        print("not reached", flush=True)
    """)
    res = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    assert "saved" in res.stdout and "not reached" not in res.stdout
    leftovers = os.listdir(tmp_path / "c")
    assert any(name != "1" for name in leftovers), leftovers  # the half-written step is on disk...
    c = ck.Checkpointer(tmp_path / "c", keep=3)
    assert c.all_steps() == [1]                                # ...but is not a checkpoint
    t = _trainer(seed=3)
    assert c.restore(t).step == 1 and int(t.state.step) == 1
    c.close()


def test_incompatible_format_version_is_a_clear_error(tmp_path):
    t = _trainer()
    c = ck.Checkpointer(tmp_path / "c")
    c.save(t)
    meta_file = tmp_path / "c" / "0" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["format_version"] = 99
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ck.IncompatibleVersionError, match="format version 99 .*reads format version 3"):
        c.restore(_trainer())
    with pytest.raises(ck.IncompatibleVersionError):
        ck.inspect(tmp_path / "c")
    c.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's event loop, after the error
def test_truncated_file_is_a_clear_error(tmp_path):
    x, y = _data()
    t = _trainer()
    t.step(x[:8], y[:8])
    c = ck.Checkpointer(tmp_path / "c")
    c.save(t)
    files = [p for p in (tmp_path / "c" / "1" / "host").rglob("*.npy") if p.is_file()]
    assert files
    for p in files:  # truncate every data file of the arrays
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(ck.CorruptCheckpointError, match="missing or truncated|checksum"):
        c.restore(_trainer())
    # a truncated description is also named
    meta_file = tmp_path / "c" / "1" / "meta" / "metadata"
    meta_file.write_text(meta_file.read_text()[:40])
    with pytest.raises(ck.CorruptCheckpointError, match="truncated or corrupt"):
        c.restore(_trainer())
    c.close()


def test_mismatched_model_config_names_what_differs(tmp_path):
    t = _trainer(temperature=1.0)
    c = ck.Checkpointer(tmp_path / "c")
    c.save(t, config={"temperature": 1.0, "blocks": 1})
    with pytest.raises(ck.ConfigMismatchError, match=r"readout: temperature: checkpoint 1.0, current 2.0"):
        c.restore(_trainer(temperature=2.0))
    with pytest.raises(ck.ConfigMismatchError, match=r"blocks: checkpoint 1, current 2"):
        c.restore(_trainer(), config={"temperature": 1.0, "blocks": 2})
    with pytest.raises(ck.ConfigMismatchError, match="not in the model"):
        c.restore(_trainer(hidden=8))
    m = _trainer(hidden=8)
    c2 = ck.Checkpointer(tmp_path / "m")
    c2.save(m)
    with pytest.raises(ck.ConfigMismatchError, match=r"params/Dense_0/kernel: checkpoint float32\(8, 8\), "
                                                     r"current float32\(16, 8\)"):
        c2.restore(_trainer(hidden=16))
    c.close()
    c2.close()


def test_unwritable_directory_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        target = "/proc/growmem-ckpt"  # not even root can create directories in /proc
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        target = str(tmp_path / "ro" / "c")
    with pytest.raises(ck.CheckpointError, match="cannot create checkpoint directory|not writable"):
        ck.Checkpointer(target)


def test_inspect_and_export_give_rows_in_plain_numpy(tmp_path):
    x, y = _data()
    t = _trainer()
    fit(t, x, y, batch_size=8, steps=3, rng=jax.random.key(0))
    c = ck.Checkpointer(tmp_path / "c")
    c.save(t, policy={"name": "append_all"})
    c.close()
    info = ck.inspect(tmp_path / "c")
    assert info["step"] == 3 and info["format_version"] == ck_manager.FORMAT_VERSION
    assert info["policy"]["name"] == "append_all" and info["verified"]
    rows = {l["layer"]: l for l in info["layers"]}
    assert rows["readout"]["rows"] == 8 + 3 * 8 and rows["readout"]["cold"] == 0
    assert rows["readout"]["kernel"] == "weighted_softmax" and rows["readout"]["temperature"] == 1.0
    text = ck.format_inspect(info)
    assert "readout" in text and "format" in text and "created at" in text
    desc = ck.export(tmp_path / "c", tmp_path / "rows.npz")
    z = np.load(tmp_path / "rows.npz")  # plain numpy, no growmem needed to read it
    d = json.loads(str(z["__description__"]))
    assert d == json.loads((tmp_path / "rows.npz.json").read_text()) == json.loads(json.dumps(desc))
    mem = t.memories()[("readout",)]
    for f in ("w", "k", "v", "born"):
        assert _bits_equal(z[f"readout/{f}"], np.asarray(getattr(mem, f))[: int(mem.size)])
    assert d["layers"]["readout"]["kernel"] == "weighted_softmax" and d["layers"]["readout"]["temperature"] == 1.0


def test_set_state_resets_row_bounds():
    """A state installed with Trainer.set_state whose memory is fuller than the trainer's
    bookkeeping believes must still get room before the next step (no row dropped)."""
    import numpy as np
    from growmem import GrowingSpec, Trainer
    from growmem.layers import GrowingLayer

    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0)
    model = GrowingLayer(spec, 2, capacity=256)
    x = np.random.default_rng(0).normal(size=(128, 3)).astype(np.float32)
    y = np.zeros((128, 2), np.float32)
    full = Trainer(model, loss="squared_error", sample_input=x[:1], donate=False)
    full.step(x, y)
    full.step(x, y)                         # 256 rows: the capacity is exactly full
    fresh = Trainer(model, loss="squared_error", sample_input=x[:1], donate=False)
    assert list(fresh.rows_in_use().values()) == [0]
    fresh.set_state(full.state)
    fresh.step(x, y)
    assert list(fresh.rows_in_use().values()) == [384]


def test_latest_meta_reads_the_newest_complete_checkpoint_without_a_manager(tmp_path):
    from growmem.checkpoint.manager import latest_meta

    assert latest_meta(tmp_path / "none") is None
    (tmp_path / "c").mkdir()
    assert latest_meta(tmp_path / "c") is None
    x, y = _data()
    t = _trainer()
    c = ck.Checkpointer(tmp_path / "c", keep=3)
    for _ in range(3):
        t.step(x[:8], y[:8])
        c.save(t)
    (tmp_path / "c" / "9.orbax-checkpoint-tmp-1").mkdir()      # an unfinished step is not a checkpoint
    try:
        assert latest_meta(tmp_path / "c") == c.read_meta() and c.read_meta()["step"] == 3
    finally:
        c.close()
    # the same checks as the manager's reader: a description from a newer format is refused
    meta_file = tmp_path / "c" / "3" / "meta" / "metadata"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "format_version": 99}))
    with pytest.raises(ck.IncompatibleVersionError):
        latest_meta(tmp_path / "c")
