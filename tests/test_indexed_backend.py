"""The Indexed backend: a trainer's layers read their rows through an inverted-file index.

References: the same model trained by a plain RAM trainer (test_dual_form checks that one against
independent computations), and growmem.index's own tests against the exact scan."""
import numpy as np
import pytest

from growmem import GrowingSpec, ResidualGrowingNet, Trainer, policies
from growmem import index as I
from growmem.backends.indexed import Indexed
from growmem.checkpoint import Checkpointer
from growmem.errors import ConfigError

D, B = 8, 16


def _data(n_batches, seed=0, clusters=12):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, D)) * 3
    x = (centres[rng.integers(0, clusters, n_batches * B)] + 0.3 * rng.normal(size=(n_batches * B, D)))
    x = x.astype(np.float32)
    return x, np.sin(x[:, :2]).astype(np.float32)


def _model(kernel="weighted_softmax", temperature=0.1):
    spec = GrowingSpec.make(kernel, eta=1.0, beta=0.5, temperature=temperature, init="random", init_rows=B) \
        if kernel == "weighted_softmax" else GrowingSpec.make(kernel, eta=0.1, temperature=temperature)
    return ResidualGrowingNet(d_out=2, n_blocks=0, block=spec, readout=spec, capacity=256)


def _trainer(backend=None, kernel="weighted_softmax", policy=None):
    return Trainer(_model(kernel), loss="squared_error", sample_input=np.zeros((1, D), np.float32),
                   backend=backend, policy=policy)


def _run(tr, x, y, steps, start=0):
    for i in range(start, steps):
        tr.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])


def _ivf(tr):
    (mem,) = tr.memories().values()
    return None if mem.ext is None else mem.ext.get("ivf")


def test_before_train_at_it_is_the_ram_trainer_bit_for_bit():
    x, y = _data(8)
    ram, ix = _trainer(), _trainer(Indexed(8, 2, train_at=8 * B * 2))
    _run(ram, x, y, 8)
    _run(ix, x, y, 8)
    assert _ivf(ix) is None
    got = np.asarray(ix.predict(x[:32]))
    assert np.abs(got).max() > 0.1
    np.testing.assert_array_equal(got, np.asarray(ram.predict(x[:32])))


@pytest.mark.parametrize("shared", [False, True], ids=["per_query", "shared"])
def test_probing_every_list_trains_as_the_exact_scan_and_every_row_is_in_one_list(shared):
    """With nprobe = n_lists the indexed retrieval is the exact one over the same rows: the same run."""
    x, y = _data(30)
    ram, ix = _trainer(), _trainer(Indexed(6, 6, train_at=6 * B, shared=shared))
    _run(ram, x, y, 30)
    _run(ix, x, y, 30)
    ivf = _ivf(ix)
    assert ivf is not None
    (mem,) = ix.memories().values()
    ids = np.asarray(ivf.lists)[np.asarray(ivf.lists) >= 0]
    assert sorted(ids.tolist()) == list(range(int(mem.size)))
    got = np.asarray(ix.predict(x[:64]))
    assert np.abs(got).max() > 0.1
    np.testing.assert_allclose(got, np.asarray(ram.predict(x[:64])), rtol=2e-3, atol=2e-4)


def test_a_full_list_doubles_every_lists_room_before_the_step_that_would_overflow_it():
    x, y = _data(40, clusters=2)            # two clusters: a few lists take every row
    tr = _trainer(Indexed(4, 2, train_at=4 * B))
    _run(tr, x, y, 6)
    first = _ivf(tr).list_capacity
    _run(tr, x, y, 40, start=6)
    ivf = _ivf(tr)
    (mem,) = tr.memories().values()
    assert ivf.list_capacity > first and int(ivf.unindexed) == 0
    assert int(ivf.counts.sum()) == int(mem.size)
    # widened, not re-assigned: the lists are those of every row assigned again, in order, to the same centroids
    again = I.add(I.empty(ivf.centroids, ivf.list_capacity, overflow=0), mem.k[:int(mem.size)],
                  np.arange(int(mem.size)), alternatives=1)
    np.testing.assert_array_equal(np.asarray(ivf.lists), np.asarray(again.lists))
    np.testing.assert_array_equal(np.asarray(ivf.counts), np.asarray(again.counts))


def test_widen_keeps_every_list_and_refuses_to_shrink():
    ix = I.add(I.empty(np.eye(3, dtype=np.float32), 4, overflow=0), np.eye(3, dtype=np.float32)[[0, 1, 0]],
               np.arange(3), alternatives=1)
    wide = I.widen(ix, 8)
    assert np.asarray(wide.lists).tolist() == [[0, 2] + [-1] * 6, [1] + [-1] * 7, [-1] * 8]
    np.testing.assert_array_equal(np.asarray(wide.counts), [2, 1, 0])
    with pytest.raises(ConfigError, match="list_capacity must be an integer >= the index's 4"):
        I.widen(ix, 2)


def test_a_resumed_run_reads_the_same_lists_bitwise(tmp_path):
    x, y = _data(30)
    a = _trainer(Indexed(6, 2, train_at=6 * B))
    _run(a, x, y, 30)
    b = _trainer(Indexed(6, 2, train_at=6 * B))
    _run(b, x, y, 18)
    assert _ivf(b) is not None
    ck = Checkpointer(tmp_path / "ck")
    ck.save(b)
    c = _trainer(Indexed(6, 2, train_at=6 * B))
    assert ck.restore(c).step == 18
    ivf_b, ivf_c = _ivf(b), _ivf(c)
    for f in ("centroids", "lists", "counts"):
        np.testing.assert_array_equal(np.asarray(getattr(ivf_c, f)), np.asarray(getattr(ivf_b, f)))
    _run(c, x, y, 30, start=18)
    np.testing.assert_array_equal(np.asarray(c.predict(x[:64])), np.asarray(a.predict(x[:64])))


def test_what_it_cannot_serve_is_refused_with_one_clear_error():
    with pytest.raises(ConfigError, match="linear kernel is not local"):
        _trainer(Indexed(4, 2), kernel="linear")
    x, y = _data(12)
    tr = _trainer(Indexed(4, 2, train_at=4 * B), policy=policies.capacity(64, on_full="evict_oldest"))
    with pytest.raises(ConfigError, match="evicting policy"):
        _run(tr, x, y, 12)
    for kw, match in (({"n_lists": 0, "nprobe": 1}, "n_lists must be an integer >= 1"),
                      ({"n_lists": 4, "nprobe": 5}, r"nprobe \(5\) cannot exceed n_lists \(4\)"),
                      ({"n_lists": 4, "nprobe": 2, "train_at": 3}, "train_at must be an integer >= n_lists")):
        with pytest.raises(ConfigError, match=match):
            Indexed(**kw)
    assert Indexed(4, 2) == Indexed(4, 2) and hash(Indexed(4, 2)) == hash(Indexed(4, 2)) and Indexed(4, 2) != Indexed(4, 3)
