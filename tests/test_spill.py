"""Training past the RAM budget: rows spill to TensorStore and training still sees all of them.

The reference for every comparison is the same model trained by a plain all-in-RAM
``Trainer`` (tested against independent computations in test_dual_form / test_policies).
"""
import numpy as np
import pytest


from growmem import GrowingSpec, ResidualGrowingNet, Trainer
from growmem import policies
from growmem.backends.tiered import Tiered, TierError, row_bytes
from growmem.checkpoint import Checkpointer, CheckpointError

D, B, CHUNK = 8, 32, 256


def _data(n_batches, seed=0, prototypes=None):
    rng = np.random.default_rng(seed)
    if prototypes is None:
        x = rng.normal(size=(n_batches * B, D))
    else:  # repeated patterns: later candidates land near old (cold) keys
        protos = rng.normal(size=(prototypes, D))
        x = protos[rng.integers(0, prototypes, n_batches * B)] + 0.05 * rng.normal(size=(n_batches * B, D))
    x = x.astype(np.float32)
    return x, np.sin(x[:, :2]).astype(np.float32)


def _spec(kernel, momentum=True):
    if kernel == "weighted_softmax":
        return GrowingSpec.make("weighted_softmax", eta=1.0, beta=0.5, momentum=0.5 if momentum else 0.0,
                                init="random", init_rows=B)
    # the linear dual form sums ⟨k, q⟩ = O(d) per row: a smaller η keeps 60 steps stable
    return GrowingSpec.make(kernel, eta=0.1 if kernel == "rbf" else 0.005, temperature=1.0)


def _spilling(model, directory, budget, policy=None, **kw):
    """A trainer whose rows past the budget spill to tiers under ``directory``."""
    tier = Tiered(directory, ram_budget_bytes=budget, **kw)
    return Trainer(model, loss="squared_error", sample_input=np.zeros((1, D), np.float32), policy=policy,
                   backend=tier), tier


def _model(spec):
    return ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=256)


def _budget(hot_rows):
    return hot_rows * (row_bytes(D, D) + row_bytes(D, 2))


def _run(trainer, x, y, steps, start=0):
    for i in range(start, steps):
        trainer.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])


def _rows_match(ref_trainer, spilling, rtol=1e-3, atol=1e-5):
    rows = spilling.host_rows()
    for path, mem in ref_trainer.memories().items():
        ref = mem.rows()
        got = rows["/".join(path)]
        assert len(got["w"]) == len(ref["w"]), "/".join(path)
        np.testing.assert_array_equal(got["born"], ref["born"])
        for f in ("w", "k", "v"):
            assert np.isfinite(ref[f]).all()
            np.testing.assert_allclose(got[f], ref[f], rtol=rtol, atol=atol, err_msg=f"{'/'.join(path)} {f}")


@pytest.mark.parametrize("kernel", ["weighted_softmax", "rbf", "linear"])
def test_spilled_training_matches_all_in_ram(tmp_path, kernel):
    x, y = _data(60)
    model = _model(_spec(kernel))
    ref = Trainer(model, loss="squared_error", sample_input=x[:1])
    sp_tr, spill = _spilling(model, tmp_path / "tier", _budget(1024), chunk_rows=CHUNK)
    _run(ref, x, y, 60)
    _run(sp_tr, x, y, 60)
    cold = sp_tr.cold_rows()
    hot = sp_tr.hot_rows()
    assert sp_tr.rows_in_use() == ref.rows_in_use()
    total = ref.rows_in_use()
    assert all(cold[k] >= 2 * CHUNK for k in cold), cold          # several spills happened
    assert all(hot[k] <= spill.hot_rows_per_layer for k in hot), hot   # the hot rows stayed within the budget
    assert all(m.capacity <= 1024 for m in sp_tr.memories().values())
    assert {k: cold[k] + hot[k] for k in hot} == total
    # the layers below the readout learned from g that flowed back through the readout's cold
    # rows: rows and predictions equal the all-in-RAM run up to float rounding
    _rows_match(ref, sp_tr)
    xt = np.random.default_rng(1).normal(size=(64, D)).astype(np.float32)
    pr, ps = np.asarray(ref.predict(xt)), np.asarray(sp_tr.predict(xt))
    assert np.abs(pr).max() > 1e-2
    np.testing.assert_allclose(ps, pr, rtol=1e-4, atol=1e-5)


def test_policies_across_tiers(tmp_path):
    """Novelty admission sees the cold keys; decay and momentum reach the cold rows lazily."""
    pol = lambda: policies.chain(policies.novelty(0.3), policies.weight_decay(0.01), policies.momentum(0.5))
    steps = 100
    x, y = _data(steps, prototypes=2000)
    model = _model(_spec("weighted_softmax", momentum=False))
    ref = Trainer(model, loss="squared_error", sample_input=x[:1], policy=pol())
    sp_tr, _ = _spilling(model, tmp_path / "tier", _budget(1024), pol(), chunk_rows=CHUNK)
    _run(ref, x, y, steps)
    _run(sp_tr, x, y, steps)
    total = ref.rows_in_use()
    assert all(n < B + steps * B * 0.8 for n in total.values()), total     # novelty refused candidates
    assert all(n >= 2 * CHUNK for n in sp_tr.cold_rows().values()), sp_tr.cold_rows()
    _rows_match(ref, sp_tr)
    xt = x[:64] + 0.01
    np.testing.assert_allclose(np.asarray(sp_tr.predict(xt)), np.asarray(ref.predict(xt)), rtol=2e-4, atol=1e-5)


def test_cold_pruning_by_compaction(tmp_path):
    """compact() drops exactly the cold rows the policy's pruning rule drops (after their lazy decay)."""
    eps = 0.01
    pol = policies.weight_decay(0.005, prune_below=eps)
    x, y = _data(70)
    model = _model(_spec("rbf"))
    tr, _ = _spilling(model, tmp_path / "tier", _budget(1024), pol, chunk_rows=CHUNK)
    _run(tr, x, y, 70)
    before = {k: v for k, v in tr.host_rows().items()}
    n_cold = tr.cold_rows()
    assert all(n >= CHUNK for n in n_cold.values())
    # independent rule (App. D.1, RBF): a row goes when ‖v‖ < ε, on the cold rows as decayed now
    expect = {k: np.linalg.norm(r["v"][:n_cold[k]], axis=1) >= eps for k, r in before.items()}
    assert any((~m).any() for m in expect.values()) and any(m.any() for m in expect.values())
    removed = tr.compact()
    after = tr.host_rows()
    for k, keep in expect.items():
        assert removed[k] == int((~keep).sum())
        assert tr.cold_rows()[k] == int(keep.sum())
        for f in ("k", "v", "born"):
            np.testing.assert_allclose(after[k][f][:keep.sum()], before[k][f][:n_cold[k]][keep], rtol=1e-6)
    tr.step(x[:B], y[:B])   # training goes on over the compacted tier


def test_resume_from_checkpoint_is_exact(tmp_path):
    """Save mid-run, keep training (more rows spill past the checkpoint), then restore in a fresh
    trainer and finish: bitwise the same as an uninterrupted spilling run."""
    x, y = _data(60)
    model = _model(_spec("weighted_softmax"))
    budget = _budget(1024)
    a, _ = _spilling(model, tmp_path / "a", budget, chunk_rows=CHUNK)
    _run(a, x, y, 60)

    b, _ = _spilling(model, tmp_path / "b", budget, chunk_rows=CHUNK)
    ck = Checkpointer(tmp_path / "ckpt")
    _run(b, x, y, 40)
    cold_at_save = b.cold_rows()
    assert all(n > 0 for n in cold_at_save.values())
    ck.save(b)
    _run(b, x, y, 56, start=40)
    assert b.cold_rows() != cold_at_save                     # rows written after the checkpoint

    c, _ = _spilling(model, tmp_path / "b", budget, chunk_rows=CHUNK, resume=True)
    r = ck.restore(c)
    assert r.step == 40 and c.cold_rows() == cold_at_save
    _run(c, x, y, 60, start=40)
    xt = x[:64]
    np.testing.assert_array_equal(np.asarray(c.predict(xt)), np.asarray(a.predict(xt)))
    ra, rc = a.host_rows(), c.host_rows()
    for k in ra:
        for f in ra[k]:
            np.testing.assert_array_equal(rc[k][f], ra[k][f])


def test_export_and_inspect_include_cold_rows(tmp_path):
    from growmem.checkpoint import export, inspect

    x, y = _data(40)
    model = _model(_spec("rbf"))
    tr, _ = _spilling(model, tmp_path / "tier", _budget(1024), policies.weight_decay(0.01), chunk_rows=CHUNK)
    _run(tr, x, y, 40)
    Checkpointer(tmp_path / "ckpt").save(tr)
    info = {l["layer"]: l for l in inspect(tmp_path / "ckpt")["layers"]}
    hot, cold = tr.hot_rows(), tr.cold_rows()
    for k in hot:
        assert (info[k]["hot"], info[k]["cold"], info[k]["rows"]) == (hot[k], cold[k], hot[k] + cold[k])
    export(tmp_path / "ckpt", tmp_path / "rows.npz")
    z = np.load(tmp_path / "rows.npz")
    for k, rows in tr.host_rows().items():
        for f in ("w", "k", "v", "born"):
            np.testing.assert_allclose(z[f"{k}/{f}"], rows[f], rtol=1e-6)


def test_preallocated_capacity_past_the_budget_is_given_back(tmp_path):
    x, _ = _data(1)
    model = ResidualGrowingNet(d_out=2, n_blocks=1, block=_spec("rbf"), readout=_spec("rbf"), capacity=8192)
    assert {m.capacity for m in Trainer(model, loss="squared_error", sample_input=x[:1]).memories().values()} == {8192}
    tr, spill = _spilling(model, tmp_path / "tier", _budget(1024), chunk_rows=CHUNK)
    assert spill.hot_rows_per_layer == 1024 and {m.capacity for m in tr.memories().values()} == {1024}


def test_errors(tmp_path):
    x, y = _data(2)
    with pytest.raises(ValueError, match="hybrid"):
        _spilling(_model(_spec("weighted_softmax")), tmp_path / "h", _budget(1024), policies.hybrid())
    with pytest.raises(ValueError, match="capacity"):
        _spilling(_model(_spec("rbf")), tmp_path / "c", _budget(1024), policies.capacity(100))
    with pytest.raises(ValueError, match="RAM budget"):
        _spilling(_model(_spec("rbf")), tmp_path / "s", _budget(300), chunk_rows=CHUNK)
    # a checkpoint of a spilling run cannot be restored into a trainer that does not spill
    tr, _ = _spilling(_model(_spec("rbf")), tmp_path / "t", _budget(1024), chunk_rows=CHUNK)
    _run(tr, x, y, 2)
    Checkpointer(tmp_path / "ck").save(tr)
    with pytest.raises(CheckpointError, match="Tiered backend"):
        Checkpointer(tmp_path / "ck").restore(Trainer(_model(_spec("rbf")), loss="squared_error",
                                                      sample_input=x[:1]))
    # the tier exists: creating it again without overwrite/resume is refused
    with pytest.raises(TierError, match="already exists"):
        _spilling(_model(_spec("rbf")), tmp_path / "t", _budget(1024), chunk_rows=CHUNK)


def test_disk_full_during_training_is_a_clear_error_and_loses_nothing(small_tmpfs):
    """A spill that fills the disk raises TierWriteError before the step; the trainer keeps every
    row and can still predict (and train on, once there is room)."""
    from growmem.backends.tiered import TierWriteError

    mnt = small_tmpfs("160k")
    x, y = _data(80)
    tr, _ = _spilling(_model(_spec("rbf")), mnt / "tier", _budget(1024), chunk_rows=CHUNK)
    err = None
    for i in range(80):
        before = (tr.rows_in_use(), int(tr.state.step))
        probe = np.asarray(tr.predict(x[:16]))
        try:
            tr.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
        except TierWriteError as e:
            err = e
            break
    assert err is not None, "the filesystem never filled"
    assert "space" in str(err).lower() and "unchanged" in str(err)
    assert sum(tr.cold_rows().values()) > 0      # earlier spills landed before the disk filled
    # a layer that spilled before the failing one moved its rows completely: none lost or doubled
    assert (tr.rows_in_use(), int(tr.state.step)) == before
    np.testing.assert_allclose(np.asarray(tr.predict(x[:16])), probe, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ how cold chunks are read

@pytest.mark.parametrize("path", ["native", "callback"])
def test_cold_chunks_are_read_by_the_native_target_or_a_callback_to_the_same_rows(tmp_path, monkeypatch, path):
    """By default the cold chunks go through the native ``growmem_cold_read`` target (its host side
    counted here); with GROWMEM_KERNELS=xla through a ``jax.pure_callback``. Either way the spilled
    trainer learns the rows of the all-in-RAM one."""
    import jax

    from growmem import native
    from growmem.backends import tier_stream

    calls = []
    real = tier_stream._host_read
    monkeypatch.setattr(tier_stream, "_host_read", lambda *a: calls.append(a[1:]) or real(*a))
    if path == "callback":
        monkeypatch.setenv("GROWMEM_KERNELS", "xla")
    else:
        assert native.available(), "the native build is missing: pip install -e ."
    jax.clear_caches()                       # the path is chosen when a step is traced
    try:
        x, y = _data(24)
        model = _model(_spec("weighted_softmax"))
        ref = Trainer(model, loss="squared_error", sample_input=x[:1])
        sp_tr, _ = _spilling(model, tmp_path / "tier", _budget(512), chunk_rows=CHUNK)
        _run(ref, x, y, 24)
        _run(sp_tr, x, y, 24)
        assert all(n >= CHUNK for n in sp_tr.cold_rows().values()), sp_tr.cold_rows()
        _rows_match(ref, sp_tr)
        np.testing.assert_allclose(np.asarray(sp_tr.predict(x[:B])), np.asarray(ref.predict(x[:B])), rtol=1e-4,
                                   atol=1e-5)
        assert (len(calls) > 0) == (path == "native"), len(calls)
        # (i, n, t, shard, fields): chunk indices inside the tier, every field for retrieval
        assert all(0 <= i * CHUNK < n for i, n, *_ in calls)
        assert path == "callback" or 0b1111 in {c[-1] for c in calls}
    finally:
        jax.clear_caches()


def test_a_resumed_spilling_process_compiles_nothing_the_first_one_compiled(tmp_path):
    """The programs that read cold rows name no Python callback, so JAX's persistent compilation cache
    keeps them: a second process running the same spilling steps (a resume, a chaos restart) loads
    every program instead of compiling it."""
    import os
    import subprocess
    import sys

    script = (
        "import sys, numpy as np\n"
        "from jax import monitoring\n"
        "programs, loaded = [], []   # every program compiled or loaded; those loaded from the cache\n"
        "monitoring.register_event_duration_secs_listener(lambda name, secs, **kw: programs.append(name) if name == "
        "'/jax/core/compile/backend_compile_duration' else None)\n"
        "monitoring.register_event_listener(lambda name, **kw: loaded.append(name) if name == "
        "'/jax/compilation_cache/cache_hits' else None)\n"
        "from growmem import GrowingSpec, ResidualGrowingNet, Trainer\n"
        "from growmem.backends.tiered import Tiered, row_bytes\n"
        "spec = GrowingSpec.make('weighted_softmax', eta=1.0, beta=0.5)\n"
        "model = ResidualGrowingNet(d_out=2, n_blocks=1, block=spec, readout=spec, capacity=256)\n"
        f"tier = Tiered(sys.argv[1], ram_budget_bytes=512 * (row_bytes({D}, {D}) + row_bytes({D}, 2)), chunk_rows={CHUNK})\n"
        f"tr = Trainer(model, loss='squared_error', sample_input=np.zeros((1, {D}), np.float32), backend=tier)\n"
        "rng = np.random.default_rng(0)\n"
        "for _ in range(24):\n"
        f"    x = rng.normal(size=({B}, {D})).astype(np.float32)\n"
        "    tr.step(x, np.sin(x[:, :2]))\n"
        "tr.predict(x)\n"
        "print(len(programs) - len(loaded), len(programs), min(tr.cold_rows().values()))\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    env.pop("GROWMEM_KERNELS", None)
    out = []
    for run in ("first", "second"):
        r = subprocess.run([sys.executable, "-c", script, str(tmp_path / run)], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out.append([int(v) for v in r.stdout.split()])
    (first, n1, cold), (second, n2, cold2) = out
    assert cold == cold2 >= CHUNK                  # both spilled the same rows
    assert first == n1 > 0 and n2 == n1 and second == 0, out
