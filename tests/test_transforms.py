"""CIFAR preprocessing (App. F.1.1): checked against plain numpy slicing, padding and statistics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from growmem.data import transforms as T


def _images(n=5, seed=0):
    return np.random.default_rng(seed).random((n, 32, 32, 3), dtype=np.float32)


def test_reflect_pad_matches_numpy_reflect():
    x = _images()
    want = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)), mode="reflect")
    got = np.asarray(T.reflect_pad(x))
    assert got.shape == (5, 40, 40, 3)
    np.testing.assert_array_equal(got, want)
    # mirrored without repeating the edge pixel: row -1 is row 1
    np.testing.assert_array_equal(got[:, 3, 4:36], x[:, 1])


@pytest.mark.parametrize("dy,dx", [(0, 0), (8, 8), (3, 5), (7, 0)])
def test_crop_of_padded_image_is_the_numpy_slice(dy, dx):
    x = _images()
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)), mode="reflect")
    b = len(x)
    got = np.asarray(T.apply_augmentation(x, np.full(b, dy), np.full(b, dx), np.zeros(b, bool)))
    np.testing.assert_array_equal(got, padded[:, dy:dy + 32, dx:dx + 32, :])


def test_crop_offsets_differ_per_image_and_all_channels_move_together():
    x = _images(3)
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)), mode="reflect")
    dy, dx = np.array([0, 4, 8]), np.array([8, 4, 1])
    got = np.asarray(T.crop(jnp.asarray(padded), dy, dx))
    for i in range(3):
        np.testing.assert_array_equal(got[i], padded[i, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32, :])
    # offset (4, 4) of the padded image is the original image
    np.testing.assert_array_equal(got[1], x[1])


def test_flip_is_exact_and_only_where_asked():
    x = _images(4)
    flip = np.array([True, False, True, False])
    got = np.asarray(T.hflip(x, flip))
    np.testing.assert_array_equal(got[0], x[0][:, ::-1, :])
    np.testing.assert_array_equal(got[2], x[2][:, ::-1, :])
    np.testing.assert_array_equal(got[1], x[1])
    np.testing.assert_array_equal(got[3], x[3])
    np.testing.assert_array_equal(np.asarray(T.hflip(got, flip)), x)  # an involution


def test_augment_is_apply_of_the_sampled_parameters_and_depends_on_the_key():
    x = _images(64)
    rng = jax.random.PRNGKey(3)
    dy, dx, flip = (np.asarray(a) for a in T.sample_augmentation(rng, 64))
    assert dy.min() >= 0 and dy.max() <= 8 and dx.min() >= 0 and dx.max() <= 8
    assert len(set(dy.tolist())) > 1 and 0 < flip.sum() < 64  # random per image
    got = np.asarray(T.augment(rng, x))
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)), mode="reflect")
    for i in range(64):
        want = padded[i, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32, :]
        np.testing.assert_array_equal(got[i], want[:, ::-1] if flip[i] else want)
    assert not np.array_equal(got, np.asarray(T.augment(jax.random.PRNGKey(4), x)))
    np.testing.assert_array_equal(got, np.asarray(T.augment(rng, x)))  # a pure function of (rng, images)
    # flattened input gives the same images
    np.testing.assert_array_equal(np.asarray(T.augment(rng, x.reshape(64, -1))), got)


def test_channel_stats_and_normalize_give_zero_mean_unit_std_per_channel():
    rng = np.random.default_rng(1)
    x = (rng.random((300, 32, 32, 3)) * np.array([0.5, 1.0, 0.25]) + np.array([0.1, 0.0, 0.6])).astype(np.float32)
    mean, std = T.channel_stats(x, chunk=70)  # several chunks
    assert mean.shape == (3,) and std.shape == (3,) and mean.dtype == np.float32
    np.testing.assert_allclose(mean, x.reshape(-1, 3).astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(std, x.reshape(-1, 3).astype(np.float64).std(0), rtol=1e-6)
    z = np.asarray(T.normalize(x, mean, std), np.float64).reshape(-1, 3)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z.std(0), 1.0, atol=1e-5)
    # the flattened (HWC) layout gives the same statistics and the same normalised values
    m2, s2 = T.channel_stats(x.reshape(300, -1))
    np.testing.assert_allclose(m2, mean, rtol=1e-6)
    np.testing.assert_allclose(s2, std, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(T.normalize(x.reshape(300, -1), mean, std)).reshape(-1, 3), z, atol=1e-6)


def test_standard_constants_are_per_channel_triples():
    for name, (mean, std) in T.CIFAR_STATS.items():
        assert len(mean) == len(std) == 3 and all(0 < m < 1 for m in mean) and all(0 < s < 0.5 for s in std)


def test_train_and_eval_transforms_shapes_dtypes_and_layout():
    x = _images(6)
    mean, std = T.CIFAR_STATS["cifar10"]
    ev = np.asarray(T.eval_transform(x, mean, std))
    assert ev.shape == (6, 3072) and ev.dtype == np.float32
    want = ((x - np.array(mean, np.float32)) / np.array(std, np.float32)).reshape(6, -1)
    np.testing.assert_allclose(ev, want, rtol=1e-6, atol=1e-6)
    tr = np.asarray(T.train_transform(jax.random.PRNGKey(0), x, mean, std))
    assert tr.shape == (6, 3072) and tr.dtype == np.float32
    # augmentation after normalisation = normalisation after augmentation (reflect padding copies pixels)
    aug = np.asarray(T.augment(jax.random.PRNGKey(0), x))
    np.testing.assert_allclose(tr, np.asarray(T.eval_transform(aug, mean, std)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="32, 32, 3"):
        T.eval_transform(np.zeros((2, 28, 28)), mean, std)


def test_epoch_batches_cover_every_sample_once_in_a_shuffled_order():
    x = _images(10)
    y = np.arange(10, dtype=np.int32)
    mean, std = T.channel_stats(x)
    batches = list(T.epoch_batches(jax.random.PRNGKey(0), x, y, 4, mean, std))
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    seen = np.concatenate([b[1] for b in batches])
    assert sorted(seen.tolist()) == list(range(10)) and seen.tolist() != list(range(10))
    assert all(b[0].shape == (len(b[1]), 3072) for b in batches)
    plain = list(T.epoch_batches(jax.random.PRNGKey(0), x, y, 4, mean, std, augment=False, drop_remainder=True))
    assert [len(b[1]) for b in plain] == [4, 4]
    for xb, yb in plain:  # without augmentation a batch is just its normalised, flattened images
        np.testing.assert_allclose(np.asarray(xb), np.asarray(T.eval_transform(x[yb], mean, std)), atol=1e-6)
