"""Mesa/FOOF, Delta-rule GD and ``make`` against independent numpy (float64) computations."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from growmem import optim
from growmem.layers import ResidualMLP


class Linear(nn.Module):
    d_out: int
    use_bias: bool = False

    @nn.compact
    def __call__(self, x):
        # HIGHEST: GPUs would otherwise compute x K (and so the gradient) in TF32
        return nn.Dense(self.d_out, use_bias=self.use_bias, precision=jax.lax.Precision.HIGHEST, name="lin")(x)


def sum_squared(pred, y):
    return 0.5 * jnp.sum((pred - y) ** 2)


def mean_squared(pred, y):
    return 0.5 * jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))


def _linear_problem(rng, n_batches, B, d_in, d_out):
    xs = rng.normal(size=(n_batches, B, d_in))
    w_true = rng.normal(size=(d_in, d_out))
    ys = xs @ w_true + 0.1 * rng.normal(size=(n_batches, B, d_out))
    return xs.astype(np.float32), ys.astype(np.float32)


def _run(model, tx, params, xs, ys, loss_fn):
    step = optim.make_train_step(model, loss_fn, tx)
    state = tx.init(params)
    for x, y in zip(xs, ys):
        params, state, _ = step(params, state, jnp.asarray(x), jnp.asarray(y))
    return params, state


# ------------------------------------------------------------------ Mesa


def test_mesa_static_exact_one_step_is_least_squares_solution():
    rng = np.random.default_rng(0)
    xs, ys = _linear_problem(rng, 1, 64, 6, 3)
    model = Linear(3)
    params = model.init(jax.random.key(0), jnp.asarray(xs[0]))["params"]
    lam = 1e-6
    tx = optim.mesa(1.0, lam=lam, gamma=1.0, variant="static", inverse="exact")
    params, _ = _run(model, tx, params, xs, ys, sum_squared)
    X, Y = xs[0].astype(np.float64), ys[0].astype(np.float64)
    w_ls = np.linalg.lstsq(X, Y, rcond=None)[0]          # the closed-form least-squares solution
    np.testing.assert_allclose(np.asarray(params["lin"]["kernel"]), w_ls, atol=2e-4)


def test_mesa_static_exact_is_ridge_over_all_batches_seen():
    """Eqs. 104–117, γ = 1, Λ_T = λ, C = W_0: W_T = (Σ YᵀX.. + λW_0)(Σ XXᵀ + λI)⁻¹ (rows)."""
    rng = np.random.default_rng(1)
    xs, ys = _linear_problem(rng, 4, 16, 5, 2)
    model = Linear(2)
    params = model.init(jax.random.key(1), jnp.asarray(xs[0]))["params"]
    k0 = np.asarray(params["lin"]["kernel"], np.float64)
    lam = 0.5
    # batch-mean loss: η = B recovers the summed-loss Newton step
    tx = optim.mesa(16.0, lam=lam, gamma=1.0, variant="static")
    params, state = _run(model, tx, params, xs, ys, mean_squared)
    X = xs.reshape(-1, 5).astype(np.float64)
    Y = ys.reshape(-1, 2).astype(np.float64)
    expected = np.linalg.solve(X.T @ X + lam * np.eye(5), X.T @ Y + lam * k0)
    np.testing.assert_allclose(np.asarray(params["lin"]["kernel"]), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(state[0].stats["lin"]), X.T @ X + lam * np.eye(5), rtol=1e-5)


def test_mesa_static_forgetting_factor_follows_algorithm_a():
    """Alg. A: Φ_T = γΦ_{T-1} + XᵀX + λ(1−γ)I, Φ_0 = λI  ⇒  Φ_T = Σ γ^{T-t} X_tᵀX_t + λI."""
    rng = np.random.default_rng(2)
    d, gamma, lam = 4, 0.7, 0.3
    tx = optim.scale_by_mesa(lam, gamma, variant="static")
    params = {"lin": {"kernel": jnp.zeros((d, 2))}}
    state = tx.init(params)
    xs = [rng.normal(size=(8, d)).astype(np.float32) for _ in range(3)]
    for t, x in enumerate(xs):
        g = rng.normal(size=(d, 2)).astype(np.float32)
        out, state = tx.update({"lin": {"kernel": jnp.asarray(g)}}, state, params, layer_inputs={"lin": x})
        phi = sum(gamma ** (t - s) * xs[s].astype(np.float64).T @ xs[s] for s in range(t + 1)) + lam * np.eye(d)
        np.testing.assert_allclose(np.asarray(out["lin"]["kernel"]), np.linalg.solve(phi, g), rtol=1e-4, atol=1e-5)


def test_mesa_cumulative_statistics_and_update_follow_eqs_119_121():
    """Ψ_T = Σ γ^{T-t} X_tᵀX_t/(B d) / Σ γ^{T-t} (Eqs. 119–120); output (Ψ_T + λI)⁻¹ G (Eq. 121)."""
    rng = np.random.default_rng(3)
    d, d_out, B, gamma, lam = 6, 3, 10, 0.9, 0.05
    tx = optim.scale_by_mesa(lam, gamma)
    params = {"a": {"kernel": jnp.zeros((d, d_out)), "bias": jnp.zeros((d_out,))}}
    state = tx.init(params)
    xs = []
    for t in range(4):
        xs.append(rng.normal(size=(B, d)) * (1 + t))
        g = rng.normal(size=(d, d_out))
        gb = rng.normal(size=(d_out,))
        grads = {"a": {"kernel": jnp.asarray(g, jnp.float32), "bias": jnp.asarray(gb, jnp.float32)}}
        out, state = tx.update(grads, state, params, layer_inputs={("a",): jnp.asarray(xs[-1], jnp.float32)})
        wts = np.array([gamma ** (t - s) for s in range(t + 1)])
        psi = sum(w * x.T @ x / (B * d) for w, x in zip(wts, xs)) / wts.sum()
        np.testing.assert_allclose(np.asarray(state.stats["a"]), psi, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(float(state.gamma_acc), wts.sum(), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out["a"]["kernel"]), np.linalg.solve(psi + lam * np.eye(d), g),
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out["a"]["bias"]), gb, rtol=1e-6)  # not preconditioned


def test_mesa_full_step_through_model_matches_numpy():
    """One Mesa step on a linear layer with bias: K ← K − η(Ψ+λI)⁻¹∇K, b ← b − η∇b."""
    rng = np.random.default_rng(4)
    xs, ys = _linear_problem(rng, 1, 12, 5, 2)
    model = Linear(2, use_bias=True)
    params = model.init(jax.random.key(2), jnp.asarray(xs[0]))["params"]
    k0 = np.asarray(params["lin"]["kernel"], np.float64)
    b0 = np.asarray(params["lin"]["bias"], np.float64)
    eta, lam = 0.1, 0.01
    new, _ = _run(model, optim.mesa(eta, lam=lam, gamma=0.99), params, xs, ys, mean_squared)
    X, Y = xs[0].astype(np.float64), ys[0].astype(np.float64)
    r = (X @ k0 + b0 - Y) / len(X)                      # ∂(mean loss)/∂y
    psi = X.T @ X / (len(X) * 5)
    np.testing.assert_allclose(np.asarray(new["lin"]["kernel"]),
                               k0 - eta * np.linalg.solve(psi + lam * np.eye(5), X.T @ r), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(new["lin"]["bias"]), b0 - eta * r.sum(0), rtol=1e-5, atol=1e-6)


def _spd(rng, d, cond):
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (q * np.geomspace(1.0, 1.0 / cond, d)) @ q.T


def test_newton_schulz_error_falls_monotonically_with_steps():
    rng = np.random.default_rng(5)
    M = _spd(rng, 12, cond=20.0)
    inv = np.linalg.inv(M)
    errs = [np.linalg.norm(np.asarray(optim.newton_schulz_inverse(jnp.asarray(M, jnp.float32), k), np.float64) - inv)
            for k in range(0, 13)]
    assert all(b < a for a, b in zip(errs[:9], errs[1:10])), errs
    assert errs[12] < 1e-4 * np.linalg.norm(inv)


def test_mesa_newton_schulz_many_steps_equals_exact_and_few_steps_do_not():
    rng = np.random.default_rng(6)
    d = 8
    x = jnp.asarray(rng.normal(size=(32, d)), jnp.float32)
    g = {"l": {"kernel": jnp.asarray(rng.normal(size=(d, 3)), jnp.float32)}}
    params = {"l": {"kernel": jnp.zeros((d, 3))}}

    def precond(**kw):
        tx = optim.scale_by_mesa(0.1, 0.9, **kw)
        return np.asarray(tx.update(g, tx.init(params), params, layer_inputs={"l": x})[0]["l"]["kernel"])

    exact = precond(inverse="exact")
    np.testing.assert_allclose(precond(inverse="newton_schulz", ns_steps=30), exact, rtol=1e-4, atol=1e-5)
    assert np.abs(precond(inverse="newton_schulz", ns_steps=1) - exact).max() > 1e-2


# ------------------------------------------------------------------ Delta


def test_delta_one_step_equals_eq_122():
    rng = np.random.default_rng(7)
    xs, ys = _linear_problem(rng, 1, 9, 4, 3)
    model = Linear(3, use_bias=True)
    params = model.init(jax.random.key(3), jnp.asarray(xs[0]))["params"]
    eta, lam = 0.05, 0.02
    new, _ = _run(model, optim.delta(eta, lam=lam), params, xs, ys, mean_squared)
    # paper convention: W = Kᵀ (d_out, d_in), X (d_in, B), G (d_out, B) stacked ∂L/∂y
    W = np.asarray(params["lin"]["kernel"], np.float64).T
    b = np.asarray(params["lin"]["bias"], np.float64)
    X = xs[0].astype(np.float64).T
    G = ((W @ X + b[:, None]) - ys[0].astype(np.float64).T) / X.shape[1]
    W_new = W @ (np.eye(4) - lam * eta * X @ X.T) - eta * G @ X.T               # Eq. 122
    np.testing.assert_allclose(np.asarray(new["lin"]["kernel"]).T, W_new, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new["lin"]["bias"]), b - eta * G.sum(1), rtol=1e-5, atol=1e-6)


def test_delta_uses_the_scheduled_learning_rate_of_each_step():
    rng = np.random.default_rng(8)
    d = 3
    k = jnp.asarray(rng.normal(size=(d, 2)), jnp.float32)
    params = {"l": {"kernel": k}}
    tx = optim.delta(lambda t: 0.1 * (t + 1), lam=0.5)
    state = tx.init(params)
    x = rng.normal(size=(4, d))
    g = rng.normal(size=(d, 2))
    for t in range(2):
        out, state = tx.update({"l": {"kernel": jnp.asarray(g, jnp.float32)}}, state, params,
                               layer_inputs={"l": jnp.asarray(x, jnp.float32)})
        eta = 0.1 * (t + 1)
        K = np.asarray(k, np.float64)
        np.testing.assert_allclose(np.asarray(out["l"]["kernel"]), -eta * (g + 0.5 * x.T @ x @ K), rtol=1e-5, atol=1e-6)


def test_delta_without_decay_is_sgd():
    rng = np.random.default_rng(9)
    params = {"l": {"kernel": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}}
    g = {"l": {"kernel": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}}
    tx = optim.delta(0.3)
    out, _ = tx.update(g, tx.init(params), params)        # no layer inputs needed when λ = 0
    np.testing.assert_allclose(np.asarray(out["l"]["kernel"]), -0.3 * np.asarray(g["l"]["kernel"]), rtol=1e-6)


# ------------------------------------------------------------------ layer inputs, errors


def test_dense_inputs_are_the_inputs_of_every_dense_layer():
    class TwoLayer(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2, name="out")(nn.relu(nn.Dense(5, name="hid")(x)))

    x = jnp.asarray(np.random.default_rng(10).normal(size=(7, 3)), jnp.float32)
    model = TwoLayer()
    v = model.init(jax.random.key(0), x)
    out, inputs = optim.dense_inputs(model, v, x)
    p = v["params"]
    hidden = np.maximum(np.asarray(x) @ np.asarray(p["hid"]["kernel"]) + np.asarray(p["hid"]["bias"]), 0)
    assert set(inputs) == {("hid",), ("out",)}
    np.testing.assert_allclose(np.asarray(inputs[("hid",)]), np.asarray(x))
    np.testing.assert_allclose(np.asarray(inputs[("out",)]), hidden, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out), np.asarray(model.apply(v, x)))
    m = ResidualMLP(d_out=2, n_blocks=2, hidden=4)
    vm = m.init(jax.random.key(0), x)
    assert {"/".join(k) for k in optim.dense_inputs(m, vm, x)[1]} == set(optim.dense_kernel_paths(vm["params"]))


def test_make_rejects_unknown_names_and_hyperparameters():
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        optim.make("lion", learning_rate=1e-3)
    with pytest.raises(ValueError, match="unknown"):
        optim.make("adam", learning_rate=1e-3, gamma=0.9)
    with pytest.raises(ValueError, match="unknown"):
        optim.make("mesa", learning_rate=1e-3, beta=0.9)
    with pytest.raises(ValueError, match="needs learning_rate"):
        optim.make("sgd")
    with pytest.raises(ValueError, match="variant"):
        optim.make("mesa", learning_rate=1e-3, variant="dynamic")
    with pytest.raises(ValueError, match="inverse"):
        optim.make("mesa", learning_rate=1e-3, inverse="cg")
    with pytest.raises(ValueError, match="λ > 0"):
        optim.make("mesa", learning_rate=1e-3, lam=0.0)
    with pytest.raises(ValueError, match="base"):
        optim.make("mesa", learning_rate=1e-3, base="lion")
    with pytest.raises(ValueError, match="λ must be >= 0"):
        optim.make("delta", learning_rate=1e-3, lam=-1.0)


def test_mesa_and_delta_refuse_missing_layer_inputs():
    params = {"a": {"kernel": jnp.zeros((3, 2))}, "b": {"kernel": jnp.zeros((2, 2))}}
    grads = jax.tree.map(jnp.ones_like, params)
    for tx in (optim.make("mesa", learning_rate=0.1), optim.make("delta", learning_rate=0.1, lam=0.1)):
        state = tx.init(params)
        with pytest.raises(ValueError, match="layer_inputs"):
            tx.update(grads, state, params)
        with pytest.raises(ValueError, match="'b'"):
            tx.update(grads, state, params, layer_inputs={"a": jnp.ones((4, 3))})
        with pytest.raises(ValueError, match="d_in"):
            tx.update(grads, state, params, layer_inputs={"a": jnp.ones((4, 5)), "b": jnp.ones((4, 2))})


SMOKE = {
    "sgd": dict(learning_rate=0.1),
    "adam": dict(learning_rate=3e-3),
    "adamw": dict(learning_rate=3e-3, weight_decay=1e-4),
    "rmsprop": dict(learning_rate=1e-3),
    "muon": dict(learning_rate=0.02),
    "mesa": dict(learning_rate=0.1, lam=0.01, gamma=0.99),
    "mesa_ns_adam": dict(learning_rate=3e-3, lam=0.01, gamma=0.9, inverse="newton_schulz", ns_steps=10, precision="default",
                         base="adam", momentum=0.85),
    "mesa_static": dict(learning_rate=0.1, lam=1.0, variant="static"),
    "delta": dict(learning_rate=0.1, lam=1e-3),
}


@pytest.mark.parametrize("case", sorted(SMOKE))
def test_every_optimizer_trains_a_residual_mlp(case):
    name = case.split("_")[0]
    rng = np.random.default_rng(11)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    labels = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int32)
    model = ResidualMLP(d_out=2, n_blocks=1, hidden=16)
    params = model.init(jax.random.key(0), jnp.asarray(x[:32]))["params"]

    def loss_fn(logits, y):
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    tx = optim.make(name, **SMOKE[case])
    step = optim.make_train_step(model, loss_fn, tx)
    state = tx.init(params)
    losses = []
    for epoch in range(6):
        for i in range(0, 256, 32):
            params, state, loss = step(params, state, jnp.asarray(x[i:i + 32]), jnp.asarray(labels[i:i + 32]))
            losses.append(float(loss))
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-8:]) < 0.8 * np.mean(losses[:8]), (losses[:8], losses[-8:])
