"""The ViT of App. F.11 and growing layers that see several queries per input (one per token).

The stored keys are checked against an independent numpy forward pass (patches cut by loops,
LayerNorm and multi-head attention written out), and the row count against B × tokens per step:
a memory whose trainer made room for only B rows a step would silently keep the first ones."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from growmem.layers import GrowingLayer, GrowingSpec, ViT
from growmem.train import Trainer, rows_per_input

SPEC = GrowingSpec.make("weighted_softmax", temperature=1.0, eta=1.0, beta=10.0, init="random", init_rows=2)


def _layer_norm(x, p, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _attention(a, p, heads):
    proj = lambda name: np.einsum("bnd,dhk->bnhk", a, p[name]["kernel"]) + p[name]["bias"]
    q, k, v = proj("query"), proj("key"), proj("value")
    logits = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    o = np.einsum("bhqs,bshk->bqhk", att, v)
    return np.einsum("bqhk,hkd->bqd", o, p["out"]["kernel"]) + p["out"]["bias"]


def _ffn_queries(params, x, shape, patch, heads):
    """numpy: the queries LN(e) the first block's FFN sees, (B, tokens, d_e)."""
    h, w, c = shape
    img = x.reshape(len(x), h, w, c)
    patches = np.stack([np.stack([img[b, i:i + patch, j:j + patch, :].reshape(-1)
                                  for i in range(0, h, patch) for j in range(0, w, patch)]) for b in range(len(x))])
    tok = patches @ params["patch_embed"]["kernel"] + params["patch_embed"]["bias"]
    cls = np.broadcast_to(params["cls"], (len(x), 1, tok.shape[-1]))
    e = np.concatenate([cls, tok], axis=1) + params["pos"]
    e = e + _attention(_layer_norm(e, params["ln_attn_0"]), params["attn_0"], heads)
    return _layer_norm(e, params["ln_ffn_0"])


def test_growing_ffn_stores_every_token_of_every_image_as_a_row():
    shape, patch, heads, b = (8, 8, 2), 4, 2, 3
    tokens = (8 // patch) ** 2 + 1
    model = ViT(d_out=5, image_shape=shape, patch=patch, d_e=16, heads=heads, n_blocks=2, ffn=SPEC, capacity=8)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(b, 128)).astype(np.float32)
    y = rng.integers(0, 5, b)
    tr = Trainer(model, tx=optax.adam(1e-3), sample_input=x, rng=jax.random.key(0))
    assert tr._per_input == {("ffn_0",): tokens, ("ffn_1",): tokens}
    params = jax.tree.map(np.asarray, tr.state.params)   # before the step: the queries it stores
    want = _ffn_queries(params, x, shape, patch, heads).reshape(b * tokens, -1)
    tr.step(x, y)
    cap = tr.memories()[("ffn_0",)].capacity
    for _ in range(4):   # 4 x 16 x 5 rows: more than the first capacity holds
        tr.step(rng.normal(size=(16, 128)).astype(np.float32), rng.integers(0, 5, 16))
    # D0's 2 rows, then B x tokens rows per step: the capacity grew for all of them, not for B a step
    n = 2 + b * tokens + 4 * 16 * tokens
    assert n > cap
    assert tr.rows_in_use() == {"ffn_0": n, "ffn_1": n}
    rows = tr.host_rows()["ffn_0"]
    np.testing.assert_allclose(rows["k"][2:2 + b * tokens], want, rtol=2e-4, atol=2e-4)
    assert np.all(np.isfinite(rows["v"])) and np.all(rows["w"] >= 0) and np.any(rows["w"][2:] > 0)
    # the attention, norms and embeddings train with the tx; the FFN has no parameters
    moved = jax.tree.map(lambda a, c: not np.allclose(a, np.asarray(c)), params, tr.state.params)
    assert moved["attn_0"]["query"]["kernel"] and moved["patch_embed"]["kernel"] and moved["readout"]["kernel"]
    assert not any(k.startswith(("ffn_", "ffn_in", "ffn_out")) for k in tr.state.params)
    assert {"ln_ffn_0", "ln_ffn_1"} <= set(tr.state.params)


def test_standard_vit_has_the_table_15_shapes():
    model = ViT(d_out=10, image_shape=(32, 32, 3), patch=4, d_e=128, heads=8, n_blocks=2, blowup=4)
    x = jnp.zeros((2, 3072))
    params = model.init(jax.random.key(0), x)["params"]
    assert params["pos"].shape == (65, 128)                       # 64 patches + CLS
    assert params["patch_embed"]["kernel"].shape == (48, 128)     # 4 x 4 x 3 pixels
    assert params["ffn_in_0"]["kernel"].shape == (128, 512)       # blowup 4
    assert model.apply({"params": params}, x).shape == (2, 10)


def test_vit_bad_input_is_explained():
    model = ViT(d_out=10, image_shape=(28, 28, 1), patch=7, d_e=16, heads=4, n_blocks=1)
    with pytest.raises(ValueError, match=r"flattened images of shape \(B, 784\)"):
        model.init(jax.random.key(0), jnp.zeros((2, 780)))
    with pytest.raises(ValueError, match="does not tile"):
        dataclasses.replace(model, patch=5).init(jax.random.key(0), jnp.zeros((2, 784)))
    with pytest.raises(ValueError, match="not divisible by heads"):
        dataclasses.replace(model, heads=3).init(jax.random.key(0), jnp.zeros((2, 784)))


class _Ragged(nn.Module):
    """A growing layer that sees one query more than the batch has inputs."""

    @nn.compact
    def __call__(self, x):
        return GrowingLayer(SPEC, 3, name="g")(jnp.concatenate([x, x[:1]]))[:len(x)]


def test_rows_per_input_refuses_a_ragged_layer():
    x = jnp.ones((4, 6))
    variables = _Ragged().init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="5 rows for a batch of 4 inputs"):
        rows_per_input(_Ragged(), variables, x)
