"""Per-row labels (policies.labels, capacity(on_full="evict_balanced")), the labels-trick loss and
SelfReplay: a growing network rehearses the inputs its first layer stores."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import growmem as gm
from growmem import policies
from growmem.train import SelfReplay, cross_entropy_present


def _net(n_blocks=1, d_out=3):
    spec = gm.GrowingSpec.make("weighted_softmax", temperature=1.0, eta=0.003, beta=3.0)
    return gm.ResidualGrowingNet(d_out=d_out, n_blocks=n_blocks, readout=spec)


def _data(n=64, d=8, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), (np.arange(n) % classes).astype(np.int32)


def test_labels_follow_their_rows_through_appends_and_balanced_eviction():
    x, y = _data(96)
    cap = 20
    tr = gm.Trainer(_net(0), sample_input=x[:4], policy=policies.capacity(cap, on_full="evict_balanced"))
    seen = {}
    for i in range(12):
        xb, yb = x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]
        tr.step(xb, yb)
        for xi, yi in zip(xb, yb):
            seen[tuple(np.round(xi, 5))] = int(yi)
        rows = tr.memories()[("readout",)].rows()
        lab = np.asarray(policies.stored_labels(tr.state.policy_state["readout"]))[:len(rows["k"])]
        assert len(rows["k"]) <= cap
        # every stored row's label is its sample's class (the keys are the normalised inputs: match by class of
        # the input with the same direction)
        xs = np.asarray(x) / np.linalg.norm(x, axis=1, keepdims=True)
        ks = rows["k"] / np.linalg.norm(rows["k"], axis=1, keepdims=True)
        src = np.argmax(ks @ xs.T, axis=1)
        np.testing.assert_array_equal(lab, y[src])
    # balanced: at the cap the classes hold (almost) equal shares, although the stream is not ordered by class
    counts = np.bincount(lab, minlength=3)
    assert counts.max() - counts.min() <= 1, counts


def test_balanced_eviction_keeps_old_classes_that_oldest_first_drops():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 6)).astype(np.float32)
    y = np.repeat(np.arange(5), 16).astype(np.int32)            # class-incremental: 16 samples of each class
    out = {}
    for mode in ("evict_balanced", "evict_oldest"):
        tr = gm.Trainer(_net(0, 5), sample_input=x[:4], policy=policies.capacity(30, on_full=mode))
        for i in range(10):
            tr.step(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])
        rows = tr.memories()[("readout",)].rows()
        src = np.argmax((rows["k"] / np.linalg.norm(rows["k"], axis=1, keepdims=True)) @
                        (x / np.linalg.norm(x, axis=1, keepdims=True)).T, axis=1)
        out[mode] = y[src]
    counts = np.bincount(out["evict_balanced"], minlength=5)
    # 30 rows over 5 classes; the newest class holds its whole last batch of 8 (candidates are never evicted)
    assert counts.min() >= 5 and counts.max() <= 8, counts
    assert 0 not in set(out["evict_oldest"].tolist())                     # a FIFO window lost the first class


def test_labels_need_integer_targets_and_one_row_per_input():
    x = np.zeros((4, 3), np.float32)
    tr = gm.Trainer(_net(0, 2), loss="squared_error", sample_input=x, policy=policies.labels())
    with pytest.raises(ValueError, match="integer class targets"):
        tr.step(x, np.zeros((4, 2), np.float32))


def test_cross_entropy_present_ignores_the_absent_classes():
    logits = jnp.asarray([[2.0, 1.0, 5.0, -1.0], [0.5, 3.0, 9.0, 0.0]])
    labels = jnp.asarray([0, 1])
    # an independent computation: the softmax over columns 0 and 1 only
    sub = np.asarray(logits)[:, :2]
    want = np.mean([-(sub[i, labels[i]] - np.log(np.exp(sub[i]).sum())) for i in range(2)])
    assert float(cross_entropy_present(logits, labels)) == pytest.approx(want, rel=1e-6)
    g = jax.grad(lambda z: cross_entropy_present(z, labels))(logits)
    np.testing.assert_array_equal(np.asarray(g)[:, 2:], 0.0)      # no gradient onto absent classes
    g_all = jax.grad(lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels).mean())(logits)
    assert np.all(np.asarray(g_all)[:, 2] > 0)                    # while plain cross-entropy pushes them down


def test_self_replay_rehearses_stored_inputs_with_their_labels():
    x, y = _data(64)
    tr = gm.Trainer(_net(1), sample_input=x[:4], policy=lambda key: policies.labels(), replay=SelfReplay(4, seed=3))
    tr.step(x[:8], y[:8])
    assert tr.rows_in_use() == {"block_0": 8, "readout": 8}       # nothing stored before: no replay
    state_before = jax.tree.map(jnp.copy, tr.state)
    mem = tr.memories()[("block_0",)]
    labels = np.asarray(policies.stored_labels(tr.state.policy_state["block_0"]))
    xr, yr = tr._with_replay(jnp.asarray(x[8:16]), jnp.asarray(y[8:16]))
    assert xr.shape == (12, 8) and yr.shape == (12,)
    keys = np.asarray(mem.k)[:8]
    for xi, yi in zip(np.asarray(xr)[8:], np.asarray(yr)[8:]):
        j = int(np.argmin(np.linalg.norm(keys - xi, axis=1)))
        np.testing.assert_allclose(xi, keys[j], rtol=0, atol=0)    # a stored row's key, exactly
        assert yi == labels[j] == y[j]                             # with its sample's class
    # a replayed key is its sample's input: the network sees the same query (RMSNorm is idempotent)
    q = np.asarray(gm.rms_norm(jnp.asarray(x[:8])))
    np.testing.assert_allclose(np.asarray(gm.rms_norm(jnp.asarray(keys))), q, rtol=1e-5, atol=1e-5)
    tr.state = state_before
    tr.step(x[8:16], y[8:16])
    assert tr.rows_in_use() == {"block_0": 20, "readout": 20}     # 8 new samples + 4 replayed
    # the draws are a function of the seed and the step: the same on another trainer at the same step
    other = gm.Trainer(_net(1), sample_input=x[:4], policy=lambda key: policies.labels(), replay=SelfReplay(4, seed=3))
    other.step(x[:8], y[:8])
    a = tr._with_replay(jnp.asarray(x[:1]), jnp.asarray(y[:1]))[1]
    other.step(x[8:16], y[8:16])
    b = other._with_replay(jnp.asarray(x[:1]), jnp.asarray(y[:1]))[1]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_self_replay_needs_labels_on_the_first_layer():
    x, y = _data(16)
    tr = gm.Trainer(_net(1), sample_input=x[:4], replay=SelfReplay(4))
    with pytest.raises(ValueError, match="labels"):
        tr.step(x[:8], y[:8])
    tr = gm.Trainer(_net(1), sample_input=x[:4], policy=lambda key: policies.labels(), replay=SelfReplay(4, "readout"))
    with pytest.raises(ValueError, match="first growing layer"):
        tr.step(x[:8], y[:8])
    with pytest.raises(ValueError, match="integer >= 1"):
        SelfReplay(0)
