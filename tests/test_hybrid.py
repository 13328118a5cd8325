"""Hybrid growth (Alg. 4): stored rows trained by an optax optimizer, new rows by novelty."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from growmem import memory as memlib
from growmem import policies as P
from growmem.layers import GrowingSpec, ResidualGrowingNet, rms_norm
from growmem.rules import Rows
from growmem.train import Trainer
from conftest import assert_in_place


def _hybrid_spec(b, T=2.0, eta=1.0, beta=3.0, init="zeros"):
    return GrowingSpec.make("weighted_softmax", eta=eta, beta=beta, temperature=T, init=init, init_rows=b)


def _hybrid_policy(tau, max_rows, tx=None):
    return P.chain(P.novelty(tau), P.capacity(max_rows, "reject"), P.hybrid(tx))


def test_initial_rows_are_zero_keys_and_values_with_weight_one_over_b():
    b = 16
    net = ResidualGrowingNet(d_out=3, n_blocks=1, block=_hybrid_spec(b), readout=_hybrid_spec(b))
    tr = Trainer(net, sample_input=np.ones((b, 5), np.float32), policy=_hybrid_policy(1.0, 100))
    for mem in tr.memories().values():
        rows = mem.rows()
        assert len(rows["w"]) == b
        np.testing.assert_array_equal(rows["k"], 0)
        np.testing.assert_array_equal(rows["v"], 0)
        np.testing.assert_allclose(rows["w"], 1.0 / b)
    assert set(tr.state.policy_state) == {"block_0", "readout"}
    assert all(isinstance(st[2], P.RowState) for st in tr.state.policy_state.values())   # the hybrid stage's moments


def test_hybrid_steps_equal_a_manual_alg4_with_a_handwritten_adam():
    """Three steps of Alg. 4 recomputed with plain jnp retrieval, brute-force novelty,
    a numpy Adam and the w ≥ 0 projection, against the trainer. (D0 is random here: with the
    zero D0 of F.4 the first gradients of the keys vanish and Adam would normalise rounding.)"""
    b, d, c, T, eta, beta, lr, tau, max_rows = 4, 6, 3, 2.0, 1.0, 3.0, 0.05, 2.5, 9
    rng = np.random.default_rng(0)
    X = np.array(rms_norm(jnp.asarray(rng.normal(size=(3 * b, d)), jnp.float32)))
    X[b + 1] = X[1] + 0.01                   # a query close to an earlier one: not novel
    Y = rng.integers(0, c, 3 * b)
    spec = _hybrid_spec(b, T=T, eta=eta, beta=beta, init="random")
    net = ResidualGrowingNet(d_out=c, n_blocks=0, readout=spec, normalize=False)
    tr = Trainer(net, sample_input=X[:b], policy=_hybrid_policy(tau, max_rows, optax.adam(lr)))

    # manual state: rows in use and Adam moments (numpy, float64)
    d0 = tr.memories()[("readout",)].rows()
    w, k, v = (d0[n].astype(np.float64) for n in "wkv")
    m = [np.zeros_like(a) for a in (w, k, v)]
    s2 = [np.zeros_like(a) for a in (w, k, v)]
    b1, b2, eps = 0.9, 0.999, 1e-8

    def loss_fn(rows, q, y):
        w, k, v = rows
        e = jnp.exp(q @ k.T / (T * math.sqrt(d)))
        s = (e @ v) / (e @ w)[:, None]
        return optax.softmax_cross_entropy_with_integer_labels(s, y).mean(), s

    for step in range(3):
        q, y = X[step * b:(step + 1) * b], Y[step * b:(step + 1) * b]
        rows = tuple(jnp.asarray(a, jnp.float32) for a in (w, k, v))
        (_, s), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(rows, jnp.asarray(q), jnp.asarray(y))
        g = np.asarray(jax.jit(jax.grad(lambda s, y: optax.softmax_cross_entropy_with_integer_labels(s, y).mean()))(
            s, jnp.asarray(y))) * b
        s = np.asarray(s)
        # Alg. 4 line 9: novelty against D_{t-1} (before the optimizer step), first that fit
        dist = np.sqrt(((q[:, None] - k[None]) ** 2).sum(-1)).min(1)
        novel = np.flatnonzero(dist > tau)[:max_rows - len(w)]
        # line 10: one Adam step on all stored rows, then w ← max(w, 0)
        new = []
        for i, (p, gr) in enumerate(zip((w, k, v), grads)):
            gr = np.asarray(gr, np.float64)
            m[i] = b1 * m[i] + (1 - b1) * gr
            s2[i] = b2 * s2[i] + (1 - b2) * gr ** 2
            mh, vh = m[i] / (1 - b1 ** (step + 1)), s2[i] / (1 - b2 ** (step + 1))
            new.append(p - lr * mh / (np.sqrt(vh) + eps))
        w, k, v = np.maximum(new[0], 0), new[1], new[2]
        # line 11: append the novel rows (Alg. 3 rule)
        w = np.concatenate([w, np.maximum(0, eta * (s[novel] * g[novel]).sum(1))])
        k = np.concatenate([k, q[novel]])
        v = np.concatenate([v, -beta * g[novel]])
        m = [np.concatenate([a, np.zeros((len(novel),) + a.shape[1:])]) for a in m]
        s2 = [np.concatenate([a, np.zeros((len(novel),) + a.shape[1:])]) for a in s2]

        tr.step(q, y)
        got = tr.memories()[("readout",)].rows()
        assert len(got["w"]) == len(w), (step, len(got["w"]), len(w))
        np.testing.assert_allclose(got["w"], w, rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(got["k"], k, rtol=2e-4, atol=1e-5)
        np.testing.assert_allclose(got["v"], v, rtol=2e-4, atol=1e-5)
    assert len(w) < b + 3 * b  # the near-duplicate query was not admitted


def test_capacity_growth_pads_the_optimizer_state():
    """A hybrid run whose memory grows past its first capacity matches one preallocated big."""
    b = 16
    rng = np.random.default_rng(1)
    X = rng.normal(size=(16 * b, 8)).astype(np.float32)   # 16 + 256 rows: outgrows 256
    Y = rng.integers(0, 4, len(X))
    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=3.0, temperature=2.0, init="zeros", init_rows=b)
    preds = []
    for capacity in (256, 512):
        net = ResidualGrowingNet(d_out=4, n_blocks=0, readout=spec, capacity=capacity)
        tr = Trainer(net, sample_input=X[:b], policy=P.hybrid(optax.adam(1e-2)))
        for i in range(0, len(X), b):
            tr.step(X[i:i + b], Y[i:i + b])
        assert tr.rows_in_use()["readout"] == b + len(X)
        preds.append(np.asarray(tr.predict(X)))
    assert tr.memories()[("readout",)].capacity == 512
    np.testing.assert_allclose(preds[0], preds[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n_keep_out", [3, 7])   # fewer / more rows leave than the 4 candidates that enter
def test_evictions_move_per_row_state_with_its_rows(n_keep_out):
    """Per-row policy state (the hybrid optimizer's moments are one) follows its rows through
    evictions; new rows start at zero; other state is left alone."""
    rng = np.random.default_rng(2)
    mem = memlib.from_rows(rng.random(10), rng.normal(size=(10, 3)), rng.normal(size=(10, 2)), capacity=256)
    drop = P.policy("drop", evict=lambda g, s: (g._replace(keep=g.keep.at[jnp.arange(n_keep_out) * 3 % 10].set(False)),
                                               s))
    # a state that identifies its row: a copy of the key, plus a scalar that must not move
    tag = P.policy("tag", init=lambda m: P.RowState({"key": m.k, "count": jnp.int32(5)}))
    pol = P.chain(drop, tag)
    cand = __import__("growmem").rules.Rows(jnp.ones(4), jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                                           jnp.ones((4, 2)))
    res = jax.jit(P.step, static_argnums=0)(pol, mem, cand, pol.init(mem))
    out = res.mem.rows()
    got = res.state[1].tree
    n = len(out["k"])
    assert n == 10 - n_keep_out + 4
    new = {tuple(k) for k in np.asarray(cand.k)}
    for i in range(n):
        want = 0.0 if tuple(out["k"][i]) in new else out["k"][i]
        np.testing.assert_array_equal(np.asarray(got["key"][i]), want)
    np.testing.assert_array_equal(np.asarray(got["key"][n:]), 0.0)
    assert int(got["count"]) == 5


def test_weights_stay_non_negative_under_a_large_learning_rate():
    b = 8
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20 * b, 6)).astype(np.float32)
    Y = rng.integers(0, 3, len(X))
    pol = P.chain(P.novelty(0.7, relative=True), P.capacity(64, "evict_oldest"), P.hybrid(optax.adam(0.5)))
    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=3.0, temperature=1.0, init="zeros", init_rows=b)
    net = ResidualGrowingNet(d_out=3, n_blocks=1, block=spec, readout=spec)
    tr = Trainer(net, sample_input=X[:b], policy=pol)
    for i in range(0, len(X), b):
        tr.step(X[i:i + b], Y[i:i + b])
    for mem in tr.memories().values():
        assert (mem.rows()["w"] >= 0).all()
        assert int(mem.size) <= 64
    assert np.isfinite(np.asarray(tr.predict(X))).all()


def test_grow_without_trainer_state_explains_what_a_hybrid_layer_needs():
    from growmem.train import grow, memories, set_memories
    net = ResidualGrowingNet(d_out=2, n_blocks=0, readout=_hybrid_spec(2))
    x = np.ones((2, 3), np.float32)
    v = net.init(jax.random.key(0), x)
    _, inter = net.apply(v, x, mutable=["intermediates"])
    mems = {p: m.replace(policy=_hybrid_policy(1.0, 10)) for p, m in memories(v).items()}
    g = {"readout": {"s": jnp.zeros((2, 2))}}
    with pytest.raises(ValueError, match="hybrid"):
        grow(set_memories({"memory": v["memory"]}, mems), inter["intermediates"], g, 2)


def test_the_hybrid_update_trains_the_rows_without_copying_its_optimizer_moments():
    """The step that trains the stored rows (Adam) and appends compiles, with the memory and the
    moments donated, to a program that copies none of the (C, d) moments or rows (a select of the
    old and new moments, to skip a non-finite step, made XLA copy all four every step)."""
    r = np.random.default_rng(0)
    c, d, b = 1024, 64, 16
    spec = _hybrid_spec(b)
    mem = memlib.from_rows(r.random(300).astype(np.float32), r.normal(size=(300, d)).astype(np.float32),
                           r.normal(size=(300, d)).astype(np.float32), capacity=c, spec=spec)
    pol = P.hybrid()
    rows = Rows(jnp.ones(b), jnp.ones((b, d)), jnp.ones((b, d)))
    grads = {"w": jnp.ones(c), "k": jnp.ones((c, d)), "v": jnp.ones((c, d))}
    step = jax.jit(lambda m, s, g: P.step(pol, m, rows, s, grads=g)[:2], donate_argnums=(0, 1))
    # rows k, v and Adam's two moments of each: six (C, d) tables written in place
    assert_in_place(step.lower(mem, pol.init(mem), grads).compile(), c * d * 4, tables=6)
    # the check itself: selecting between old and new moments (the bug this guards) fails it
    def select_step(m, s, g):
        m2, s2 = P.step(pol, m, rows, s, grads=g)[:2]
        ok = jnp.isfinite(g["k"][0, 0])
        return m2, jax.tree.map(lambda a, b: jnp.where(ok, a, b * 0.5), s2, s)
    with pytest.raises(AssertionError):
        assert_in_place(jax.jit(select_step, donate_argnums=(0, 1)).lower(mem, pol.init(mem), grads).compile(),
                        c * d * 4, tables=6)
    # and it still trains: one step moves the stored keys, a non-finite gradient moves nothing
    out, state = step(memlib.from_rows(*(np.asarray(a)[:300] for a in (mem.w, mem.k, mem.v)), capacity=c, spec=spec),
                      pol.init(mem), grads)
    assert not np.allclose(np.asarray(out.k)[:300], np.asarray(mem.k)[:300])
    bad = dict(grads, k=grads["k"].at[0, 0].set(jnp.nan))
    fresh = memlib.from_rows(*(np.asarray(a)[:300] for a in (mem.w, mem.k, mem.v)), capacity=c, spec=spec)
    out, state = step(fresh, pol.init(fresh), bad)
    np.testing.assert_array_equal(np.asarray(out.k)[:300], np.asarray(mem.k)[:300])
    assert all(not np.any(np.asarray(a)) for a in jax.tree.leaves(state) if np.ndim(a) == 2)
