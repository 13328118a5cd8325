"""Dual form (Eq. 1, App. A): growing layers trained by appending rows equal SGD on weights.

(a) linear kernel: ``growmem.Trainer`` on a GrowingLayer / ResidualGrowingNet equals the
    same network written with explicit weight matrices updated by SGD (``W_T = W0 + Σ k vᵀ``);
(b) PDK rule (Eq. 19): a degree-2 polynomial-kernel growing net built from
    ``growmem.kernels.scan_rows`` + ``growmem.rules.sgd`` + ``growmem.memory`` equals SGD on
    the explicit feature map of the kernel;
(c) RBF (Alg. 5): a growing RBF layer trained by Trainer equals functional gradient
    descent written independently in numpy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem import GrowingLayer, GrowingSpec, ResidualGrowingNet, Trainer, kernels, memory, rules


def stream(seed, steps, b, d_in, d_out, scale=1.0):
    r = np.random.default_rng(seed)
    a = r.normal(size=(d_in, d_out))
    xs = (scale * r.normal(size=(steps, b, d_in))).astype(np.float32)
    ys = np.sin(xs @ a).astype(np.float32)
    x_test = (scale * r.normal(size=(16, d_in))).astype(np.float32)
    return xs, ys, x_test


def sq_loss(pred, y, grad_unit):
    """Mean over the batch (batch_mean: SGD on L) or sum (per_sample: SGD on Σ_n ℓ_n)."""
    per = jnp.sum((pred - y) ** 2, axis=-1)
    return jnp.mean(per) if grad_unit == "batch_mean" else jnp.sum(per)


# ---------------------------------------------------------------- (a) linear dual form


@pytest.mark.parametrize("grad_unit", ["batch_mean", "per_sample"])
def test_linear_growing_layer_equals_sgd_trained_linear_layer(grad_unit):
    d_in, d_out, b, steps, eta = 5, 3, 8, 40, 0.05
    xs, ys, x_test = stream(0, steps, b, d_in, d_out, scale=1 / np.sqrt(d_in))
    spec = GrowingSpec.make("linear", eta=eta, grad_unit=grad_unit)
    trainer = Trainer(GrowingLayer(spec, d_out, capacity=memory.ROW_QUANTUM), loss="squared_error",
                      sample_input=xs[0], rng=jax.random.key(1))
    assert trainer.memories()[()].capacity < steps * b   # the run must grow the memory
    w0 = np.asarray(trainer.state.collections["frozen"]["W0"], np.float64)   # (d_in, d_out)
    W = w0.copy()
    for x, y in zip(xs, ys):
        trainer.step(x, y)
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        resid = 2.0 * (x64 @ W - y64)                         # ∂ℓ_n/∂s_n of ‖s_n - y_n‖²
        grad = x64.T @ resid                                  # ∇_W Σ_n ℓ_n
        if grad_unit == "batch_mean":
            grad /= b                                         # ∇_W of the batch-mean loss
        W -= eta * grad
    # 320 rows: the memory grew past its first capacity (256) on the way
    mem = trainer.memories()[()]
    assert int(mem.size) == steps * b and mem.capacity >= steps * b
    # Eq. 1: the predictions are those of the SGD-trained matrix ...
    got = np.asarray(trainer.predict(x_test))
    np.testing.assert_allclose(got, x_test.astype(np.float64) @ W, rtol=1e-4, atol=1e-4)
    # ... and the rows are its rank-one updates: W_T = W0 + Σ_i k_i v_iᵀ
    rows = mem.rows()
    np.testing.assert_allclose(w0 + rows["k"].astype(np.float64).T @ rows["v"], W, rtol=1e-4, atol=1e-5)
    assert not np.allclose(W, w0, atol=1e-2)  # training did something


def _rms_norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def explicit_residual_net(weights, x):
    """Eq. 13 with explicit matrices: e ← e + relu(RMSNorm(e) W_ℓ); y = RMSNorm(e) W_out."""
    e = x
    for W in weights[:-1]:
        e = e + jax.nn.relu(_rms_norm(e) @ W)
    return _rms_norm(e) @ weights[-1]


@pytest.mark.parametrize("grad_unit,eta", [("batch_mean", 0.02), ("per_sample", 0.003)])
def test_linear_residual_growing_net_equals_sgd_trained_network(grad_unit, eta):
    d, d_out, b, steps = 6, 2, 8, 20
    xs, ys, x_test = stream(1, steps, b, d, d_out)
    spec = GrowingSpec.make("linear", eta=eta, grad_unit=grad_unit)
    net = ResidualGrowingNet(d_out=d_out, n_blocks=2, block=spec, readout=spec, nonlinearity=jax.nn.relu)
    trainer = Trainer(net, loss="squared_error", sample_input=xs[0], rng=jax.random.key(2))
    frozen = trainer.state.collections["frozen"]
    names = ("block_0", "block_1", "readout")
    with jax.enable_x64(True):
        weights = [jnp.asarray(np.asarray(frozen[n]["W0"]), jnp.float64) for n in names]
        w0 = [np.asarray(W) for W in weights]

        @jax.jit
        def sgd_step(weights, x, y):
            grads = jax.grad(lambda ws: sq_loss(explicit_residual_net(ws, x), y, grad_unit))(weights)
            return [W - eta * G for W, G in zip(weights, grads)]

        for x, y in zip(xs, ys):
            trainer.step(x, y)
            weights = sgd_step(weights, jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64))
        expect = np.asarray(explicit_residual_net(weights, jnp.asarray(x_test, jnp.float64)))
        weights = [np.asarray(W) for W in weights]
    got = np.asarray(trainer.predict(x_test))
    np.testing.assert_allclose(got, expect, rtol=2e-4, atol=2e-4)
    # every layer's rows are the rank-one SGD updates of its matrix (W_T = W0 + Σ k vᵀ)
    mems = trainer.memories()
    for n, W, W0 in zip(names, weights, w0):
        rows = mems[(n,)].rows()
        assert rows["k"].shape[0] == steps * b
        np.testing.assert_allclose(W0 + rows["k"].astype(np.float64).T @ rows["v"], W, rtol=1e-3, atol=1e-4)
        assert not np.allclose(W, W0, atol=1e-3), n  # every layer learned


# ---------------------------------------------------------------- (b) PDK rule, explicit features


def poly2_features(x):
    """ψ(x) with ⟨ψ(x), ψ(x')⟩ = (1 + ⟨x, x'⟩)²: [1, √2 x_i, x_i², √2 x_i x_j (i<j)]."""
    d = x.shape[-1]
    i, j = np.triu_indices(d, k=1)
    return jnp.concatenate([jnp.ones(x.shape[:-1] + (1,), x.dtype), np.sqrt(2.0) * x, x * x,
                            np.sqrt(2.0) * x[..., i] * x[..., j]], axis=-1)


def poly2_retrieve(q, mem, chunk=4):
    """Eq. 14 with φ(k, q) = (1 + ⟨k, q⟩)², chunked over the memory rows in use."""
    def body(num, rows, valid):
        kc, vc = rows
        phi = jnp.where(valid[None, :], (1.0 + q @ kc.T) ** 2, 0.0)
        return num + phi @ vc
    return kernels.scan_rows(body, jnp.zeros((q.shape[0], mem.v.shape[1]), q.dtype), (mem.k, mem.v),
                             size=mem.size, chunk=chunk)


def test_poly2_feature_map_reproduces_kernel():
    r = np.random.default_rng(3)
    with jax.enable_x64(True):
        x, x2 = r.normal(size=(5, 4)), r.normal(size=(7, 4))
        gram = np.asarray(poly2_features(jnp.asarray(x)) @ poly2_features(jnp.asarray(x2)).T)
    np.testing.assert_allclose(gram, (1.0 + x @ x2.T) ** 2, rtol=1e-12, atol=1e-12)


def test_pdk_growing_net_equals_sgd_on_explicit_features():
    """Two growing layers with φ(x,x') = (1+⟨x,x'⟩)² and tanh between (App. A.1):
    F(x) = f₂(tanh(f₁(x))). Rows from rules.sgd (k = q, v = -η g, Eq. 19) with g from the
    same backward pass equal SGD on W_ℓ (Eq. 18) in the explicit feature space (Eq. 15)."""
    r = np.random.default_rng(4)
    d_in, d_h, d_out, b, steps, n0, eta = 3, 4, 2, 4, 12, 3, 0.05
    xs = 0.5 * r.normal(size=(steps, b, d_in))
    ys = np.tanh(xs.sum(-1, keepdims=True) * np.ones(d_out))
    x_test = 0.5 * r.normal(size=(10, d_in))
    # D0 for each layer (nonzero, or the gradient into layer 1 would vanish)
    k1, v1 = 0.5 * r.normal(size=(n0, d_in)), 0.3 * r.normal(size=(n0, d_h))
    k2, v2 = 0.5 * r.normal(size=(n0, d_h)), 0.3 * r.normal(size=(n0, d_out))

    with jax.enable_x64(True):
        mems = (memory.from_rows(jnp.ones(n0), jnp.asarray(k1), jnp.asarray(v1)),
                memory.from_rows(jnp.ones(n0), jnp.asarray(k2), jnp.asarray(v2)))

        def growing_forward(mems, x, p1, p2):
            h = poly2_retrieve(x, mems[0]) + p1
            z = jnp.tanh(h)
            return poly2_retrieve(z, mems[1]) + p2, (x, h, z)

        @jax.jit
        def growing_step(mems, x, y):
            def loss(p1, p2):
                out, inter = growing_forward(mems, x, p1, p2)
                return jnp.mean(jnp.sum((out - y) ** 2, -1)), (out, inter)
            (_, (out, (q1, s1, q2))), (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
                jnp.zeros((x.shape[0], d_h)), jnp.zeros((x.shape[0], d_out)))
            new = []
            for mem, (q, s, g) in zip(mems, ((q1, s1, g1), (q2, out, g2))):
                rows = rules.sgd(q, s, g, eta=eta)
                new.append(memory.append(mem, rows.w, rows.k, rows.v, born=1))
            return tuple(new)

        # explicit weights W_ℓ = Σ_{D0} v ψ(k)ᵀ (Eq. 15), trained by SGD on the mean loss
        weights = [jnp.asarray(v1).T @ poly2_features(jnp.asarray(k1)),
                   jnp.asarray(v2).T @ poly2_features(jnp.asarray(k2))]

        def explicit_forward(ws, x):
            z = jnp.tanh(poly2_features(x) @ ws[0].T)
            return poly2_features(z) @ ws[1].T

        @jax.jit
        def sgd_step(ws, x, y):
            grads = jax.grad(lambda ws: jnp.mean(jnp.sum((explicit_forward(ws, x) - y) ** 2, -1)))(ws)
            return [W - eta * G for W, G in zip(ws, grads)]

        x_t = jnp.asarray(x_test)
        predict = jax.jit(lambda mems, x: growing_forward(mems, x, 0.0, 0.0)[0])
        before = np.asarray(explicit_forward(weights, x_t))
        np.testing.assert_allclose(np.asarray(predict(mems, x_t)), before, rtol=1e-10)
        for x, y in zip(xs, ys):
            mems = growing_step(mems, jnp.asarray(x), jnp.asarray(y))
            weights = sgd_step(weights, jnp.asarray(x), jnp.asarray(y))
        got = np.asarray(predict(mems, x_t))
        expect = np.asarray(explicit_forward(weights, x_t))
    assert int(mems[0].size) == n0 + steps * b
    np.testing.assert_allclose(got, expect, rtol=1e-9, atol=1e-11)
    assert np.abs(expect - before).max() > 1e-2  # training moved the function


# ---------------------------------------------------------------- (c) RBF, functional GD


@pytest.mark.parametrize("grad_unit", ["per_sample", "batch_mean"])
def test_rbf_growing_layer_equals_numpy_functional_gradient_descent(ref, grad_unit):
    d_in, d_out, b, steps, temp, eta = 4, 2, 8, 15, 0.8, 0.3
    xs, ys, x_test = stream(5, steps, b, d_in, d_out)
    spec = GrowingSpec.make("rbf", eta=eta, temperature=temp, grad_unit=grad_unit)
    trainer = Trainer(GrowingLayer(spec, d_out), loss="squared_error", sample_input=xs[0])
    keys = np.zeros((0, d_in))
    vals = np.zeros((0, d_out))

    def predict(q):   # Alg. 5 line 5, written out
        q = q.astype(np.float64)
        d2 = ((q[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2 / (2 * temp * np.sqrt(d_in))) @ vals

    for x, y in zip(xs, ys):
        trainer.step(x, y)
        g = 2.0 * (predict(x) - y)                  # per-sample ∂‖s_n - y_n‖²/∂s_n
        if grad_unit == "batch_mean":
            g = g / b                               # ∂(batch-mean loss)/∂s_n
        keys = np.concatenate([keys, x])            # Alg. 5 line 8: (q, -η g)
        vals = np.concatenate([vals, -eta * g])
    expect = predict(x_test)
    np.testing.assert_allclose(np.asarray(trainer.predict(x_test)), expect, rtol=1e-4, atol=1e-5)
    rows = trainer.memories()[()].rows()
    np.testing.assert_allclose(rows["k"], keys, rtol=1e-6)
    np.testing.assert_allclose(rows["v"], vals, rtol=1e-4, atol=1e-6)
    assert np.abs(expect).max() > 1e-2
