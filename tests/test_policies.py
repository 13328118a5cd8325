"""Built-in policies and chain(), each checked against an independent computation."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import memory as memlib
from growmem import policies as P
from growmem.layers import GrowingSpec, ResidualGrowingNet
from growmem.rules import Rows
from growmem.train import Trainer


jstep = jax.jit(P.step, static_argnums=0)


def rand_mem(rng, n, d_in, d_out, capacity=None, spec=None, w=None):
    k = rng.normal(size=(n, d_in)).astype(np.float32)
    v = rng.normal(size=(n, d_out)).astype(np.float32)
    w = rng.uniform(0.1, 1.0, size=n).astype(np.float32) if w is None else w
    born = np.arange(n, dtype=np.int32) // 4
    return memlib.from_rows(w, k, v, born, capacity=capacity, spec=spec)


# --------------------------------------------------------------------------------------- chain


def _tagging(name, log):
    """A policy that records the order of its stages and narrows the mask by one candidate."""
    def admit(g, state):
        log.append(("admit", name))
        drop = jnp.argmax(g.mask)  # first still-admitted candidate
        return g._replace(mask=g.mask.at[drop].set(False)), state + 1

    def age(g, state):
        log.append(("age", name))
        return g._replace(mem=g.mem.replace(v=g.mem.v * 2.0)), state

    def evict(g, state):
        log.append(("evict", name))
        return g._replace(keep=g.keep.at[jnp.argmax(g.keep)].set(False)), state

    return P.policy(name, init=lambda mem: jnp.zeros((), jnp.int32), admit=admit, age=age, evict=evict,
                    coeff=lambda born, t, r: jnp.full(born.shape, 3.0), retention=0.5)


def test_chain_runs_stages_in_order_and_each_policy_narrows_the_previous_result():
    log = []
    pol = P.chain(_tagging("a", log), _tagging("b", log))
    rng = np.random.default_rng(0)
    mem = rand_mem(rng, 6, 3, 2)
    rows = Rows(jnp.ones(4), jnp.asarray(rng.normal(size=(4, 3)), jnp.float32), jnp.ones((4, 2)))
    res = jstep(pol, mem, rows, pol.init(mem))  # traced once: the log records one call per stage
    assert log == [("admit", "a"), ("admit", "b"), ("age", "a"), ("age", "b"), ("evict", "a"), ("evict", "b")]
    assert [int(s) for s in res.state] == [1, 1]
    np.testing.assert_array_equal(res.mask, [False, False, True, True])      # a, b each dropped one
    np.testing.assert_array_equal(res.keep[:6], [False, False, True, True, True, True])
    got = res.mem.rows()
    # the kept rows, aged twice, and the admitted candidates (in the evicted rows' places), found by key
    by_key = {tuple(k): i for i, k in enumerate(got["k"])}
    for j in range(2, 6):
        i = by_key[tuple(np.asarray(mem.k[j]))]
        np.testing.assert_allclose(got["v"][i], 4.0 * np.asarray(mem.v[j]))
        assert got["born"][i] == int(mem.born[j])
    for j in (2, 3):
        i = by_key[tuple(np.asarray(rows.k[j]))]
        np.testing.assert_allclose(got["v"][i], 1.0)
        assert got["born"][i] == 1
    assert int(res.mem.t) == 1 and int(res.mem.size) == 6
    assert pol.retention == 0.25
    np.testing.assert_allclose(pol.coeff(mem.born, mem.t, pol.retention), 9.0)
    assert P.chain(_tagging("a", log)).name == "chain(a)"


def test_chain_checks_its_members_and_its_state_and_names_states():
    with pytest.raises(TypeError, match="Policy"):
        P.chain(P.novelty(1.0), "capacity")
    with pytest.raises(TypeError, match="no longer holds a policy"):
        GrowingSpec.make("weighted_softmax", policy=P.novelty(1.0))
    with pytest.raises(ValueError, match="momentum is set 2 times"):
        P.chain(P.momentum(0.5), P.momentum(0.6))
    pol = P.chain(P.novelty(1.0), P.capacity(10))
    mem = rand_mem(np.random.default_rng(0), 4, 3, 2)
    rows = Rows(jnp.ones(2), jnp.asarray([[10.0] * 3, [20.0] * 3]), jnp.ones((2, 2)))   # far from every row
    with pytest.raises(ValueError, match="chain of 2 policies got a tuple of length 1"):
        P.step(pol, mem, rows, ((),))
    named = P.named_chain(("fresh", P.novelty(1.0)), ("cap", P.capacity(5, "evict_oldest")))
    st = named.init(mem)
    assert set(st) == {"fresh", "cap"}
    with pytest.raises(ValueError, match="named_chain"):
        P.step(named, mem, rows, {"fresh": ()})
    assert int(jstep(named, mem, rows, st).mem.size) == 5     # 4 + 2 novel, the oldest evicted
    # a factory called twice gives two policies: each trainer compiles for the one it was given
    assert P.novelty(1.0) is not P.novelty(1.0)


@pytest.mark.parametrize("bad", [lambda: P.novelty(-1.0), lambda: P.capacity(0), lambda: P.capacity(5, "drop"),
                                 lambda: P.weight_decay(1.0), lambda: P.weight_decay(-0.1),
                                 lambda: P.weight_decay(0.1, prune_below=-1.0), lambda: P.momentum(1.0)])
def test_builtins_reject_impossible_parameters(bad):
    with pytest.raises(ValueError, match="must be"):
        bad()


# --------------------------------------------------------------------------------------- novelty


def brute_min_dist(q, k):
    return np.sqrt(((q[:, None, :].astype(np.float64) - k[None, :, :]) ** 2).sum(-1)).min(axis=1)


def test_min_sq_distance_matches_brute_force_over_rows_in_use_only():
    rng = np.random.default_rng(1)
    mem = rand_mem(rng, 700, 16, 2, capacity=1024)  # chunks of 64: 11 in use, padding skipped
    q = rng.normal(size=(9, 16)).astype(np.float32)
    q[3] = np.asarray(mem.k[123])                      # an exact duplicate of a stored key
    got = np.sqrt(np.asarray(P.min_sq_distance(jnp.asarray(q), mem.k, size=mem.size, chunk=64)))
    want = brute_min_dist(q, np.asarray(mem.k[:700]))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3)
    assert np.isinf(P.min_sq_distance(jnp.asarray(q), mem.k, size=0)).all()


@pytest.mark.parametrize("within_batch", [False, True])
def test_novelty_admits_exactly_the_candidates_farther_than_tau(within_batch):
    rng = np.random.default_rng(2)
    d = 8
    mem = rand_mem(rng, 300, d, 3, capacity=512)
    stored = np.asarray(mem.k[:300])
    q = rng.normal(size=(32, d)).astype(np.float32)
    q[:8] = stored[:8] + 0.05 * rng.normal(size=(8, d))   # near stored rows
    q[20] = q[19] + 0.01                                    # near each other within the batch
    dist = brute_min_dist(q, stored)
    tau = float(np.median(dist))
    rows = Rows(jnp.ones(32), jnp.asarray(q), jnp.zeros((32, 3)))
    pol = P.novelty(tau, within_batch=within_batch, chunk=128)
    mask = _admit(pol, rows, mem)
    want = dist > tau
    if within_batch:  # greedy in batch order against the admitted candidates before
        for n in range(32):
            if want[n] and any(want[m] and np.linalg.norm(q[n] - q[m]) <= tau for m in range(n)):
                want[n] = False
    np.testing.assert_array_equal(np.asarray(mask), want)
    # relative τ is in units of √d
    if not within_batch:
        rel = _admit(P.novelty(tau / math.sqrt(d), relative=True), rows, mem)
        np.testing.assert_array_equal(np.asarray(rel), dist > tau)


@pytest.mark.parametrize("within_batch", [False, True])
def test_novelty_admits_replayed_candidates_untested_only_when_asked(within_batch):
    rng = np.random.default_rng(5)
    d = 6
    mem = rand_mem(rng, 50, d, 2, capacity=64)
    stored = np.asarray(mem.k[:50])
    q = np.concatenate([stored[:4], stored[:4] + 10.0, stored[:4]]).astype(np.float32)   # copies, far, copies
    replayed = np.zeros(12, bool)
    replayed[8:] = True                                    # the last four rehearse stored rows
    rows = Rows(jnp.ones(12), jnp.asarray(q), jnp.zeros((12, 2)))
    far = brute_min_dist(q, stored) > 1.0
    assert far.tolist() == [False] * 4 + [True] * 4 + [False] * 4

    def admitted(pol):
        return np.asarray(_admit(pol, rows, mem, replayed=jnp.asarray(replayed)))

    # the paper's test refuses a rehearsal (a copy of a stored key, at distance 0) like any near candidate
    np.testing.assert_array_equal(admitted(P.novelty(1.0, within_batch=within_batch)), far)
    # admit_replayed: the rehearsals enter, the stream's candidates are still tested
    got = admitted(P.novelty(1.0, within_batch=within_batch, admit_replayed=True))
    np.testing.assert_array_equal(got, far | replayed)
    # no replay marks (a trainer without SelfReplay): the option changes nothing
    np.testing.assert_array_equal(_admit(P.novelty(1.0, within_batch=within_batch, admit_replayed=True), rows, mem),
                                  far)


def _admit(pol, rows, mem, replayed=None):
    """The candidates ``pol``'s admit stage lets in (all candidates offered; ``replayed``: those marked as
    rehearsals)."""
    g = P.Growth(mem, rows, jnp.ones(rows.k.shape[0], bool), memlib.valid_mask(mem), replayed=replayed)
    return jax.jit(lambda g: pol.admit(g, ())[0].mask)(g)


def test_novelty_sees_only_stored_rows_by_default():
    mem = memlib.from_rows(np.ones(1), np.zeros((1, 4)), np.zeros((1, 1)))
    q = jnp.asarray(np.ones((2, 4)), jnp.float32)  # two identical candidates, both far from row 0
    rows = Rows(jnp.ones(2), q, jnp.zeros((2, 1)))
    m = _admit(P.novelty(1.0), rows, mem)
    assert np.asarray(m).tolist() == [True, True]
    m = _admit(P.novelty(1.0, within_batch=True), rows, mem)
    assert np.asarray(m).tolist() == [True, False]


# --------------------------------------------------------------------------------------- capacity


N_STEPS, BATCH, CAP = 1000, 100, 1000  # 100k candidates through a 1k cap


def _drive(pol, seed=0):
    """Stream N_STEPS·BATCH candidates through ``pol``; candidate i has key[0] = i."""
    d = 2
    mem = memlib.empty(d, 1, CAP)
    rng = np.random.default_rng(seed)
    ids = np.arange(N_STEPS * BATCH, dtype=np.float32).reshape(N_STEPS, BATCH)
    keys = np.stack([ids, rng.normal(size=ids.shape).astype(np.float32)], -1)
    vals = rng.uniform(0.0, 1.0, size=(N_STEPS, BATCH, 1)).astype(np.float32)
    ws = rng.uniform(0.0, 1.0, size=(N_STEPS, BATCH)).astype(np.float32)

    @jax.jit
    def run(mem, xs):
        def body(carry, x):
            mem, state = carry
            w, k, v = x
            res = P.step(pol, mem, Rows(w, k, v), state)
            return (res.mem, res.state), res.mem.size
        (mem, _), sizes = jax.lax.scan(body, (mem, pol.init(mem)), xs)
        return mem, sizes

    mem, sizes = run(mem, (jnp.asarray(ws), jnp.asarray(keys), jnp.asarray(vals)))
    score = np.maximum(ws, vals[..., 0]).reshape(-1)  # significance max(|w|, ‖ṽ‖)
    return mem, np.asarray(sizes), score


@pytest.mark.parametrize("on_full", ["reject", "evict_oldest", "evict_smallest"])
def test_capacity_never_exceeds_the_cap_and_keeps_the_right_rows(on_full):
    mem, sizes, score = _drive(P.capacity(CAP, on_full))
    assert sizes.max() <= CAP and sizes[-1] == CAP
    np.testing.assert_array_equal(sizes[:10], np.arange(1, 11) * BATCH)
    got = np.sort(np.asarray(mem.k[:CAP, 0]).astype(np.int64))
    if on_full == "reject":          # Alg. 4: the first candidates that fit
        want = np.arange(CAP)
    elif on_full == "evict_oldest":  # a FIFO window: the last CAP candidates
        want = np.arange(N_STEPS * BATCH - CAP, N_STEPS * BATCH)
    else:                            # the CAP most significant of all candidates seen
        want = np.sort(np.argsort(-score, kind="stable")[:CAP])
    np.testing.assert_array_equal(got, want)
    # born matches the step that brought each row (evicted rows' places are reused, so the table
    # is not in arrival order; born is)
    ids = np.asarray(mem.k[:CAP, 0]).astype(np.int64)
    np.testing.assert_array_equal(np.asarray(mem.born[:CAP]), ids // BATCH + 1)
    assert len(set(ids.tolist())) == CAP


def test_capacity_reject_after_novelty_keeps_the_first_novel_candidates():
    mem = memlib.from_rows(np.ones(2), np.zeros((2, 2)), np.zeros((2, 1)))
    k = jnp.asarray([[0.0, 0.1], [5, 0], [0.1, 0], [6, 0], [7, 0]], jnp.float32)
    rows = Rows(jnp.ones(5), k, jnp.ones((5, 1)))
    pol = P.chain(P.novelty(1.0), P.capacity(4, "reject"))
    res = jstep(pol, memlib.with_capacity(mem, 256), rows, pol.init(mem))
    np.testing.assert_array_equal(np.asarray(res.mask), [False, True, False, True, False])
    assert int(res.mem.size) == 4


# --------------------------------------------------------------------------------------- weight decay


def test_weight_decay_scales_stored_rows_and_not_the_new_ones():
    rng = np.random.default_rng(3)
    for kernel in ("weighted_softmax", "rbf"):
        spec = GrowingSpec.make(kernel, eta=1.0, beta=1.0) if kernel == "weighted_softmax" else \
            GrowingSpec.make(kernel, eta=1.0)
        mem = rand_mem(rng, 5, 3, 2, spec=spec)
        pol = P.weight_decay(0.25)
        rows = Rows(jnp.full(2, 0.7), jnp.ones((2, 3)), jnp.ones((2, 2)))
        res = jstep(pol, mem, rows, ())
        got = res.mem.rows()
        np.testing.assert_allclose(got["v"][:5], 0.75 * np.asarray(mem.v[:5]), rtol=1e-6)
        wf = 0.75 if kernel == "weighted_softmax" else 1.0
        np.testing.assert_allclose(got["w"][:5], wf * np.asarray(mem.w[:5]), rtol=1e-6)
        np.testing.assert_allclose(got["w"][5:], 0.7)
        np.testing.assert_allclose(got["v"][5:], 1.0)


def test_weight_decay_with_pruning_keeps_a_long_stream_bounded():
    gamma, eps, batch, steps = 0.1, 1e-3, 8, 3000
    rng = np.random.default_rng(4)
    vals = rng.uniform(0.5, 1.0, size=(steps, batch, 4)).astype(np.float32) / 2.0  # ‖v‖ ≤ 1
    ws = rng.uniform(0.0, 1.0, size=(steps, batch)).astype(np.float32)
    keys = rng.normal(size=(steps, batch, 3)).astype(np.float32)
    pol = P.weight_decay(gamma, prune_below=eps)
    # a row of size ≤ 1 is below ε after L scalings, L = ceil(log(ε) / log(1-γ)): at most L
    # generations of B rows are alive after any step (the new batch plus L-1 scaled ones)
    life = math.ceil(math.log(eps) / math.log(1 - gamma))
    mem = memlib.empty(3, 4, batch * (life + 1))

    @jax.jit
    def run(mem, xs):
        def body(mem, x):
            res = P.step(pol, mem, Rows(*x), ())
            return res.mem, res.mem.size
        return jax.lax.scan(body, mem, xs)

    mem, sizes = run(mem, (jnp.asarray(ws), jnp.asarray(keys), jnp.asarray(vals)))
    sizes = np.asarray(sizes)
    assert sizes.max() <= batch * life
    assert sizes[steps // 2] == sizes[-1]                     # a plateau, not growth
    assert (np.asarray(significance_np(mem)) >= eps * (1 - gamma)).all()


def significance_np(mem):
    n = int(mem.size)
    return np.maximum(np.abs(np.asarray(mem.w[:n])), np.linalg.norm(np.asarray(mem.v[:n]), axis=1))


@pytest.mark.parametrize("kernel", ["weighted_softmax", "rbf", "linear"])
def test_pruning_changes_outputs_by_no_more_than_the_epsilon_bound(kernel):
    """Removing rows with |w|, ‖ṽ‖ < ε moves y by at most (derivation in weight_decay's doc):
    softmax ε(1+‖y‖) Σ_pruned c e^a / Σ_kept c w e^a;  rbf ε Σ_pruned c;  linear ε‖q‖ Σ_pruned c‖k‖."""
    eps, d_in, d_out = 1e-2, 6, 3
    rng = np.random.default_rng(5)
    hyper = {"eta": 1.0, "beta": 1.0} if kernel == "weighted_softmax" else {"eta": 1.0}
    spec = GrowingSpec.make(kernel, temperature=1.0, momentum=0.6, **hyper)
    n = 400
    k = rng.normal(size=(n, d_in)).astype(np.float32)
    v = rng.normal(size=(n, d_out)).astype(np.float32)
    w = rng.uniform(0.2, 1.0, size=n).astype(np.float32)
    tiny = rng.random(n) < 0.5
    v[tiny] *= (eps * 0.99 / np.linalg.norm(v[tiny], axis=1))[:, None] * rng.uniform(0, 1, (tiny.sum(), 1))
    w[tiny] = rng.uniform(0, eps * 0.99, tiny.sum())
    born = rng.integers(0, 50, n).astype(np.int32)
    mem = memlib.from_rows(w, k, v, born, spec=spec).replace(t=jnp.asarray(60, jnp.int32))
    pol = P.weight_decay(0.0, prune_below=eps)
    no_rows = Rows(jnp.zeros(1), jnp.zeros((1, d_in)), jnp.zeros((1, d_out)))
    refuse = P.policy("refuse", admit=lambda g, s: (g._replace(mask=g.mask & False), s))
    pol = P.chain(refuse, pol)
    pruned_mem = jax.jit(lambda m: P.step(pol, m, no_rows, ((), ())).mem)(mem).replace(t=mem.t)
    assert int(pruned_mem.size) == n - tiny.sum()

    from growmem.layers import retrieve
    q = rng.normal(size=(20, d_in)).astype(np.float32)
    y = np.asarray(jax.jit(retrieve)(mem, jnp.asarray(q)), np.float64)
    y2 = np.asarray(jax.jit(retrieve)(pruned_mem, jnp.asarray(q)), np.float64)
    c = (1 - 0.6 ** (60 - born + 1)) / (1 - 0.6)
    if kernel == "weighted_softmax":
        e = c * np.exp(q @ k.T / math.sqrt(d_in))          # (20, n)
        bound = eps * (1 + np.linalg.norm(y, axis=1)) * (e[:, tiny].sum(1) / (e[:, ~tiny] * w[~tiny]).sum(1))
    elif kernel == "rbf":
        bound = eps * np.full(20, c[tiny].sum())
    else:
        bound = eps * np.linalg.norm(q, axis=1) * (c[tiny] * np.linalg.norm(k[tiny], axis=1)).sum()
    err = np.linalg.norm(y - y2, axis=1)
    assert (err > 0).any()
    assert (err <= bound * (1 + 1e-4) + 1e-6).all(), (err, bound)


# --------------------------------------------------------------------------------------- momentum


def _grow_single_layer(spec, X, Y, batch, policy=None):
    net = ResidualGrowingNet(d_out=Y.shape[1], n_blocks=0, readout=spec, normalize=False)
    tr = Trainer(net, loss="squared_error", sample_input=X[:batch], rng=jax.random.key(0), policy=policy)
    preds = []
    for i in range(0, len(X), batch):
        preds.append(np.asarray(tr.predict(X)))
        tr.step(X[i:i + batch], Y[i:i + batch])
    preds.append(np.asarray(tr.predict(X)))
    return tr, preds


@pytest.mark.parametrize("gamma", [0.0, 0.05])
def test_momentum_on_linear_equals_sgd_with_an_explicit_velocity_buffer(gamma):
    """Eqs. 92–93 on the weight matrix: V ← μV − ηB∇L, W ← (1−γ)W + V (γ=0: Eq. 22/23)."""
    mu, eta, batch, d_in, d_out = 0.8, 0.01, 4, 5, 2
    rng = np.random.default_rng(6)
    X = rng.normal(size=(48, d_in)).astype(np.float32)
    Y = rng.normal(size=(48, d_out)).astype(np.float32)
    pol = P.chain(P.momentum(mu), P.weight_decay(gamma)) if gamma else P.momentum(mu)
    tr, preds = _grow_single_layer(GrowingSpec.make("linear", eta=eta), X, Y, batch, pol)
    W = np.asarray(tr.state.collections["frozen"]["readout"]["W0"], np.float64)
    V = np.zeros_like(W)
    for t, i in enumerate(range(0, len(X), batch)):
        np.testing.assert_allclose(preds[t], X @ W, rtol=1e-4, atol=1e-4)
        x, y = X[i:i + batch], Y[i:i + batch]
        grad = x.T @ (2 * (x @ W - y)) / batch            # ∇_W of the batch-mean loss
        V = mu * V - eta * batch * grad                     # per-sample unit: rows carry -η g_n
        W = (1 - gamma) * W + V
    np.testing.assert_allclose(preds[-1], X @ W, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gamma", [0.0, 0.1])
def test_momentum_on_rbf_equals_an_explicit_velocity_function(gamma):
    """The velocity ν and the function f are kept explicitly as coefficient vectors over
    the rows (ν ← μν + new rows, f ← (1−γ)f + ν), stepped one at a time in numpy."""
    mu, eta, T, batch, d_in, d_out = 0.7, 0.5, 1.0, 4, 3, 2
    rng = np.random.default_rng(7)
    X = rng.normal(size=(40, d_in)).astype(np.float32)
    Y = rng.normal(size=(40, d_out)).astype(np.float32)
    pol = P.chain(P.weight_decay(gamma), P.momentum(mu)) if gamma else P.momentum(mu)
    _, preds = _grow_single_layer(GrowingSpec.make("rbf", eta=eta, temperature=T), X, Y, batch, pol)
    keys, vals = np.zeros((0, d_in)), np.zeros((0, d_out))
    vel, coef = np.zeros(0), np.zeros(0)

    def f(q):
        d2 = ((q[:, None] - keys[None]) ** 2).sum(-1)
        return (np.exp(-d2 / (2 * T * math.sqrt(d_in))) * coef) @ vals

    for t, i in enumerate(range(0, len(X), batch)):
        np.testing.assert_allclose(preds[t], f(X), rtol=1e-4, atol=1e-5)
        x, y = X[i:i + batch], Y[i:i + batch]
        g = 2 * (f(x) - y)                                   # per-sample ∂ℓ_n/∂s_n
        keys, vals = np.concatenate([keys, x]), np.concatenate([vals, -eta * g])
        vel = np.concatenate([mu * vel, np.ones(batch)])    # ν_t = μ ν_{t-1} + (new rows)
        coef = np.concatenate([(1 - gamma) * coef, np.zeros(batch)]) + vel   # f_t = (1-γ) f_{t-1} + ν_t
    np.testing.assert_allclose(preds[-1], f(X), rtol=1e-4, atol=1e-5)


def test_momentum_policy_retrieves_like_the_spec_momentum_field():
    from growmem.layers import retrieve
    rng = np.random.default_rng(8)
    q = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
    base = rand_mem(rng, 12, 4, 3).replace(t=jnp.asarray(5, jnp.int32))
    base = base.replace(born=base.born.at[0].set(-1))  # an initial row: c = 1
    outs = [np.asarray(jax.jit(retrieve)(base.replace(spec=spec, policy=pol), q))
            for spec, pol in ((GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, momentum=0.9), None),
                              (GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0), P.momentum(0.9)))]
    np.testing.assert_array_equal(outs[0], outs[1])
    # both at once would multiply: refused
    with pytest.raises(ValueError, match="momentum is set twice"):
        retrieve(base.replace(spec=GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, momentum=0.9),
                              policy=P.momentum(0.9)), q)


def test_decayed_momentum_coefficients_match_eq_100():
    mu, gamma = 0.9, 0.2
    born = jnp.asarray([-1, 0, 3, 7, 10])
    t = 10
    c = np.asarray(P.momentum_coefficients(born, t, mu, 1 - gamma))
    for b, ci in zip(np.asarray(born), c):
        if b < 0:
            assert ci == 1.0
            continue
        # Eq. 97: C(t,j) = Σ_{k=j}^{t} (1-γ)^{t-k+1} μ^{k-j}; the row already carries (1-γ)^{t-j}
        # and η̃ = η/(1-γ) absorbs one (1-γ)
        C = sum((1 - gamma) ** (t - k + 1) * mu ** (k - b) for k in range(b, t + 1))
        np.testing.assert_allclose(ci * (1 - gamma) ** (t - b), C / (1 - gamma), rtol=1e-5)


# --------------------------------------------------------------------------------------- trainer


def test_trainer_carries_policy_state_and_bounds_every_layer():
    def counting():
        def admit(g, state):
            return g, state + g.mask.sum()
        return P.policy("count", init=lambda mem: jnp.zeros((), jnp.int32), admit=admit)

    pol = P.chain(counting(), P.novelty(0.5, relative=True), P.capacity(40, "evict_oldest"))
    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, temperature=2.0, init="zeros", init_rows=8)
    net = ResidualGrowingNet(d_out=3, n_blocks=1, block=spec, readout=spec)
    rng = np.random.default_rng(9)
    X = rng.normal(size=(96, 10)).astype(np.float32)
    Y = rng.integers(0, 3, 96)
    tr = Trainer(net, sample_input=X[:8], policy=pol)
    for i in range(0, 96, 8):
        tr.step(X[i:i + 8], Y[i:i + 8])
    assert set(tr.state.policy_state) == {"block_0", "readout"}
    assert int(tr.state.policy_state["readout"][0]) == 96
    assert all(0 < n <= 40 for n in tr.rows_in_use().values())
    assert np.isfinite(np.asarray(tr.predict(X))).all()


def test_smallest_selects_like_a_full_lexicographic_sort():
    """The top_k shortcut that picks the rows a capacity policy evicts equals numpy's lexsort by
    (score, order key, position), ties and invalid entries included, below and above k."""
    r = np.random.default_rng(3)
    smallest = jax.jit(P._smallest, static_argnums=3)   # a few shapes, compiled once each
    for trial in range(200):
        c, k = int(r.choice([1, 6, 59])), int(r.choice([1, 4, 9]))
        score = (r.integers(0, 4, c) if trial % 2 else r.random(c)).astype(np.float32)  # many ties, or none
        valid = r.random(c) < 0.8
        key = r.integers(0, 5, c).astype(np.int32)
        key[r.random(c) < 0.2] = np.iinfo(np.int32).max
        n = int(r.integers(0, valid.sum() + 1))
        got = np.asarray(smallest(jnp.asarray(score), jnp.asarray(valid), jnp.int32(n), k, jnp.asarray(key)))
        idx = np.flatnonzero(valid)
        want = np.zeros(c, bool)
        want[idx[np.lexsort((idx, key[idx], score[idx]))][:n]] = True
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}: n={n}, k={k}")


def test_a_capped_memory_stops_growing_its_capacity_at_the_cap():
    """The trainer grows a memory geometrically, but never past a capacity policy's max_rows
    (rounded to the row quantum): the rows past it would never be used."""
    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, temperature=2.0, init="zeros", init_rows=8)
    net = ResidualGrowingNet(d_out=3, n_blocks=1, block=spec, readout=spec, capacity=256)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(1200, 6)).astype(np.float32)
    Y = rng.integers(0, 3, 1200)
    free = Trainer(net, sample_input=X[:16])
    capped = Trainer(net, sample_input=X[:16], policy=P.capacity(600, "evict_smallest"))
    for i in range(0, 1200, 16):
        free.step(X[i:i + 16], Y[i:i + 16])
        capped.step(X[i:i + 16], Y[i:i + 16])
    assert all(m.capacity == 2048 for m in free.memories().values())
    assert all(m.capacity == memlib.round_capacity(600) == 768 for m in capped.memories().values())
    assert all(n == 600 for n in capped.rows_in_use().values())


def test_set_capacity_allocates_exactly_and_carries_rows_and_row_state():
    """Trainer.set_capacity resizes every memory to exactly the rows asked for (no quantum): the rows
    in use, the predictions and the per-row policy state (labels) are unchanged, the steps that follow
    stay within it under a cap, and asking for fewer rows than are in use is refused."""
    spec = GrowingSpec.make("weighted_softmax", eta=1.0, beta=1.0, temperature=2.0, init="zeros", init_rows=8)
    net = ResidualGrowingNet(d_out=3, n_blocks=1, block=spec, readout=spec, capacity=256)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    Y = rng.integers(0, 3, 400)
    tr = Trainer(net, sample_input=X[:16], policy=P.capacity(100, "evict_balanced"))
    for i in range(0, 64, 16):
        tr.step(X[i:i + 16], Y[i:i + 16])
    before_rows, before_out = tr.host_rows(), np.asarray(tr.predict(X[:50]))
    labels = {k: np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tr.state.policy_state)}
    assert any(a.ndim and len(a) == 256 for a in labels.values())    # per-row state exists, at the old capacity
    tr.set_capacity(116)
    assert all(m.capacity == 116 for m in tr.memories().values())
    np.testing.assert_array_equal(np.asarray(tr.predict(X[:50])), before_out)
    for layer, rows in tr.host_rows().items():
        for f in ("w", "k", "v", "born"):
            np.testing.assert_array_equal(rows[f], before_rows[layer][f])
    after = {k: np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tr.state.policy_state)}
    for k, a in labels.items():
        b = after[k]
        np.testing.assert_array_equal(b[:min(len(a), len(b))] if a.ndim else b, a[:len(b)] if a.ndim else a)
        assert a.ndim == 0 or len(b) == 116
    for i in range(64, 400, 16):
        tr.step(X[i:i + 16], Y[i:i + 16])
    assert all(m.capacity == 116 for m in tr.memories().values())
    assert all(n == 100 for n in tr.rows_in_use().values())
    with pytest.raises(ValueError, match="holds 100 rows"):
        tr.set_capacity(99)
