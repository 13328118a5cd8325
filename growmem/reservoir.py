"""Which samples of a stream a buffer of fixed size keeps: the slot each arriving sample takes.

* ``reservoir`` — Vitter's reservoir (Algorithm R) over the whole stream: the ``n``-th sample enters
  with probability ``capacity / n``, replacing a uniform victim, so the buffer is a uniform sample of
  everything seen, whatever the order;
* ``balanced`` — the class-balanced reservoir (CBRS: Chrysakis & Moens, "Online continual learning
  from imbalanced data", ICML 2020, Algorithm 1): while the buffer is full, a class is *full* once it
  has been the largest in the buffer (ties included; it stays full). A sample of a class that is not
  full replaces a random sample of a largest class; a sample of a full class enters with probability
  ``m_c / n_c`` (its class's samples in the buffer over those seen) and replaces a random sample of
  its own class. Without the "stays full" rule a buffer whose size the classes do not divide could
  never balance exactly: some class would always be one short and let every newcomer in. Each class's share of the buffer is a uniform sample of
  that class's stream, so a class that comes back later (Permuted-MNIST's ten domains) is kept from
  every time it came, not only from the last.

Random replacement (a newcomer and the stored samples of its class compete uniformly) is neither: it
keeps a stored sample for a geometrically short time, so a buffer of it forgets every domain but
the last.

One :class:`Slots` serves the online replay buffer (:class:`growmem.continual.baselines.OnlineReplay`)
and the budget of :class:`growmem.order_free.KNN`; the owner keeps the rows and their classes, the
slots keep the counts, and the draws come from the owner's ``numpy`` generator (whose state it saves).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .errors import ConfigError

POLICIES = ("reservoir", "balanced")
_WORD = (1 << 64) - 1


def rng_state(rng: np.random.Generator) -> np.ndarray:
    """The state of a PCG64 ``numpy`` generator (``default_rng``'s) as six uint64 words — state, increment
    (128 bits each, high word first), ``has_uint32``, ``uinteger`` — an array a checkpoint stores as it
    stores any other (:func:`set_rng_state` reads it back)."""
    st = rng.bit_generator.state
    if st.get("bit_generator") != "PCG64":
        raise ConfigError(f"rng_state saves PCG64 generators (np.random.default_rng), not {st.get('bit_generator')}")
    s, inc = int(st["state"]["state"]), int(st["state"]["inc"])
    return np.asarray([s >> 64, s & _WORD, inc >> 64, inc & _WORD, st["has_uint32"], st["uinteger"]], np.uint64)


def set_rng_state(rng: np.random.Generator, words) -> None:
    """Put the state :func:`rng_state` returned back into ``rng`` (a PCG64 generator): it draws on from there."""
    w = [int(x) for x in np.asarray(words, np.uint64).reshape(-1)]
    if len(w) != 6:
        raise ConfigError(f"a PCG64 state is 6 uint64 words, got {len(w)}")
    rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                               "has_uint32": w[4], "uinteger": w[5]}


class Slots:
    """The slot of each sample offered to a buffer of ``capacity`` rows (module docstring).

    :meth:`offer` takes the sample's class and the classes of the buffer's rows (the owner's array, at
    least ``size`` long) and returns the row it goes to — ``size`` (the next free row) while the
    buffer fills, a victim's row once full — or None when it does not enter."""

    def __init__(self, capacity: int, n_classes: int, policy: str, rng: np.random.Generator):
        if policy not in POLICIES:
            raise ConfigError(f"unknown buffer policy {policy!r}; choose one of {POLICIES}")
        if int(capacity) < 1 or int(n_classes) < 1:
            raise ConfigError(f"a buffer needs capacity >= 1 and n_classes >= 1, got {capacity}, {n_classes}")
        self.capacity, self.n_classes, self.policy, self.rng = int(capacity), int(n_classes), policy, rng
        self.size = 0
        self.seen = 0
        self.seen_class = np.zeros(self.n_classes, np.int64)
        self.held = np.zeros(self.n_classes, np.int64)      # the buffer's rows by class
        self.full = np.zeros(self.n_classes, bool)          # has been a largest class of the full buffer

    def offer(self, c: int, labels: np.ndarray) -> Optional[int]:
        c = int(c)
        self.seen += 1
        self.seen_class[c] += 1
        if self.size < self.capacity:
            self.size += 1
            self.held[c] += 1
            return self.size - 1
        if self.policy == "reservoir":
            j = int(self.rng.integers(0, self.seen))
            if j >= self.capacity:
                return None
            victim = int(labels[j])
        else:
            most = self.held.max()
            self.full |= self.held == most
            if not self.full[c]:
                victim = int(np.argmax(self.held))           # the lowest id among the largest classes
            elif self.rng.random() < self.held[c] / self.seen_class[c]:
                victim = c
            else:
                return None
            j = int(self.rng.choice(np.flatnonzero(np.asarray(labels[:self.size]) == victim)))
        self.held[victim] -= 1
        self.held[c] += 1
        return j

    # ------------------------------------------------------------------ state
    def state(self) -> Dict[str, np.ndarray]:
        return {"slots_counts": np.asarray([self.size, self.seen], np.int64), "slots_seen_class": self.seen_class.copy(),
                "slots_full": self.full.copy()}

    def load_state(self, st: Dict[str, np.ndarray], labels: np.ndarray) -> None:
        """The counts of a saved :meth:`state`, the rows' classes ``labels`` (``size`` of them) as loaded."""
        size, seen = (int(v) for v in np.asarray(st["slots_counts"]).reshape(-1))
        seen_class = np.asarray(st["slots_seen_class"], np.int64).reshape(-1)
        full = np.asarray(st["slots_full"], bool).reshape(-1)
        labels = np.asarray(labels).reshape(-1)
        if len(labels) != size or size > self.capacity or seen_class.shape != (self.n_classes,) or \
                full.shape != (self.n_classes,) or seen_class.sum() != seen or seen < size:
            raise ConfigError(f"a buffer state of {size} rows ({len(labels)} labels), {seen} samples seen does not fit "
                              f"this buffer of {self.capacity} rows and {self.n_classes} classes")
        self.size, self.seen, self.seen_class, self.full = size, seen, seen_class.copy(), full.copy()
        self.held = np.bincount(labels.astype(np.int64), minlength=self.n_classes)[:self.n_classes].astype(np.int64)
