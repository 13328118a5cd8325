"""CIFAR preprocessing of App. F.1.1, in JAX.

Images are channel-last ``(B, 32, 32, 3)`` floats in [0, 1] (``growmem.data.load("cifar10",
flatten=False)``), or the same flattened to ``(B, 3072)`` in height-width-channel order (what
``load`` returns by default); every function accepts either.

* :func:`normalize` — per-channel ``(x - mean) / std``. ``mean``/``std`` come from
  :func:`channel_stats` on the training images (exact, recommended) or :data:`CIFAR_STATS`.
* :func:`augment` — reflect-pad by 4, a random 32x32 crop (the same offset for all 3 channels of an
  image, independent across images), and a random horizontal flip with probability 1/2.
  Reflect padding (numpy's ``mode="reflect"``: the edge pixel is not repeated) copies pixel values,
  so it commutes with the per-channel affine normalisation: the order of the two does not matter.
* :func:`train_transform` = normalise, augment, flatten to ``(B, 3072)``; :func:`eval_transform` =
  normalise, flatten (test data, and the single-pass non-augmented runs of Fig. 2/Right).
* :func:`epoch_batches` — one epoch as in App. F.1.1: every training image once, each with a
  freshly drawn augmentation, in a shuffled order.

All of these are pure functions of their inputs (the randomness comes from ``rng``) and jittable.
"""
from __future__ import annotations

from functools import partial
from typing import Iterator, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

#: per-channel (R, G, B) mean and standard deviation of the training pixels in [0, 1], as commonly
#: quoted for the 50,000 training images (population std over all pixels of a channel). They were
#: not recomputed here; ``channel_stats(x_train)`` gives the exact values of the data you load.
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
SIZE, CHANNELS, PAD = 32, 3, 4


def _as_images(x):
    """``(B, 3072)`` (HWC order) or ``(B, 32, 32, 3)`` -> ``(B, 32, 32, 3)``."""
    if x.ndim == 2 and x.shape[1] == SIZE * SIZE * CHANNELS:
        return x.reshape(x.shape[0], SIZE, SIZE, CHANNELS)
    if x.ndim == 4 and x.shape[1:] == (SIZE, SIZE, CHANNELS):
        return x
    raise ConfigError(f"expected images (B, 32, 32, 3) or (B, 3072), got shape {tuple(x.shape)}")


def channel_stats(images, chunk: int = 5000) -> Tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (population) standard deviation over all pixels of ``images``
    (``(n, 32, 32, 3)`` or ``(n, 3072)``), accumulated in float64; float32 arrays of shape (3,)."""
    x = np.asarray(images)
    x = x.reshape(len(x), -1, CHANNELS) if x.ndim == 2 else x.reshape(len(x), -1, x.shape[-1])
    if x.shape[-1] != CHANNELS or len(x) == 0:
        raise ConfigError(f"expected a non-empty batch of 3-channel images, got shape {np.shape(images)}")
    count, total = 0, np.zeros(CHANNELS)
    for i in range(0, len(x), chunk):
        part = x[i:i + chunk].astype(np.float64)
        total += part.sum(axis=(0, 1))
        count += part.shape[0] * part.shape[1]
    mean = total / count
    sq = np.zeros(CHANNELS)
    for i in range(0, len(x), chunk):
        part = x[i:i + chunk].astype(np.float64) - mean
        sq += (part * part).sum(axis=(0, 1))
    return mean.astype(np.float32), np.sqrt(sq / count).astype(np.float32)


def normalize(images, mean, std):
    """``(x - mean) / std`` per channel; keeps the input's shape (``(B, 32, 32, 3)`` or ``(B, 3072)``)."""
    x = jnp.asarray(images)
    mean, std = jnp.asarray(mean, x.dtype), jnp.asarray(std, x.dtype)
    return ((_as_images(x) - mean) / std).reshape(x.shape)


def flatten(images):
    """``(B, 32, 32, 3)`` -> ``(B, 3072)`` in height-width-channel order (the loader's layout)."""
    x = _as_images(jnp.asarray(images))
    return x.reshape(x.shape[0], -1)


def reflect_pad(images, pad: int = PAD):
    """Pad height and width by ``pad`` pixels, mirrored at the edge (numpy ``mode="reflect"``)."""
    x = _as_images(jnp.asarray(images))
    return jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")


def crop(padded, dy, dx, size: int = SIZE):
    """Image ``i``'s ``size x size`` window at rows ``dy[i]:dy[i]+size``, columns ``dx[i]:dx[i]+size``
    (all channels)."""
    def one(img, y, x):
        return jax.lax.dynamic_slice(img, (y, x, 0), (size, size, img.shape[-1]))
    return jax.vmap(one)(padded, jnp.asarray(dy, jnp.int32), jnp.asarray(dx, jnp.int32))


def hflip(images, flip):
    """Mirror image ``i`` left-right where ``flip[i]`` is true."""
    x = _as_images(jnp.asarray(images))
    return jnp.where(jnp.asarray(flip, bool)[:, None, None, None], x[:, :, ::-1, :], x)


def sample_augmentation(rng, batch: int, pad: int = PAD):
    """Random ``(dy, dx, flip)`` for ``batch`` images: offsets uniform in ``0..2*pad``, flips with p = 1/2."""
    ky, kx, kf = jax.random.split(rng, 3)
    dy = jax.random.randint(ky, (batch,), 0, 2 * pad + 1)
    dx = jax.random.randint(kx, (batch,), 0, 2 * pad + 1)
    return dy, dx, jax.random.bernoulli(kf, 0.5, (batch,))


def apply_augmentation(images, dy, dx, flip, pad: int = PAD):
    """Reflect-pad, crop at ``(dy, dx)``, flip where ``flip``: ``(B, 32, 32, 3)`` out."""
    return hflip(crop(reflect_pad(images, pad), dy, dx), flip)


@partial(jax.jit, static_argnames=("pad",))
def augment(rng, images, pad: int = PAD):
    """App. F.1.1 augmentation of a batch: reflect-pad ``pad``, random 32x32 crop, random horizontal
    flip. ``(B, 32, 32, 3)`` or ``(B, 3072)`` in, ``(B, 32, 32, 3)`` out."""
    x = _as_images(jnp.asarray(images))
    return apply_augmentation(x, *sample_augmentation(rng, x.shape[0], pad), pad=pad)


@jax.jit
def train_transform(rng, images, mean, std):
    """Normalise, augment, flatten: ``(B, 3072)`` float (training batches)."""
    return flatten(augment(rng, normalize(_as_images(jnp.asarray(images)), mean, std)))


@jax.jit
def eval_transform(images, mean, std):
    """Normalise and flatten, no augmentation: ``(B, 3072)`` float (test data; single-pass runs)."""
    return flatten(normalize(_as_images(jnp.asarray(images)), mean, std))


def epoch_batches(rng, images, labels, batch_size: int, mean, std, *, augment: bool = True,
                  drop_remainder: bool = False) -> Iterator[Tuple[jax.Array, np.ndarray]]:
    """One epoch: a random permutation of all samples in batches of ``batch_size``, each batch
    normalised, augmented with fresh randomness (``augment=True``) and flattened. Yields
    ``(x (b, 3072), y (b,))``; the last smaller batch is dropped when ``drop_remainder``."""
    images, labels = np.asarray(images), np.asarray(labels)
    n = len(images)
    if len(labels) != n:
        raise ConfigError(f"{n} images but {len(labels)} labels")
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    k_perm, k_aug = jax.random.split(rng)
    order = np.asarray(jax.random.permutation(k_perm, n))
    stop = n - n % batch_size if drop_remainder else n
    for b, i in enumerate(range(0, stop, batch_size)):
        idx = order[i:i + batch_size]
        x = images[idx]
        out = (train_transform(jax.random.fold_in(k_aug, b), x, mean, std) if augment
               else eval_transform(x, mean, std))
        yield out, labels[idx]
