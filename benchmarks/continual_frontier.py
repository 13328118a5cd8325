"""The accuracy-against-bytes frontier: every method at budgets that force a choice, online and offline.

**Protocol: online** (the main one, the standard online continual-learning protocol): each stream sample
is seen once, in mini-batches of 10; a replay method rehearses 10 samples from its buffer at every step.
**Protocol: offline** (``--protocol offline``, beside it): a baseline trains for several epochs on each
experience — ``replay_bytes`` (Avalanche's Replay, its epochs chosen on the validation split with
``--tune --protocol offline``) and ``gdumb_bytes`` (GDumb's recipe: an MLP retrained from scratch on its
class-balanced buffer, 128 epochs, trained after the last experience alone: it retrains from scratch at
every experience, so the final model is the same bit for bit); growmem's target memories and kNN are
order-free and keep each sample once (a second pass would store it twice), so their offline run is their
preset's own batch, one pass.
Every method is bounded by the same budget (``--budgets``, peak bytes in use checked: ``within_budget``), and
is evaluated on the whole test stream after each experience (Avalanche's accuracy matrix); the number
reported is the final accuracy, the mean over the test experiences.

**Methods** (:mod:`growmem.continual.methods`, named by what they store):

* growmem — ``target:dct_merge`` (a target memory whose rows become prototypes under the budget:
  Ward merges, class-balanced), ``target:dct`` (the shipped preset: the most redundant rows are
  evicted), ``net:replay_dct`` (a growing network: error-driven rows in a residual block and the readout,
  self-replay of its rows), ``net:readout_replay_dct`` (the same without the block: error-driven rows in the
  readout alone, on the fixed DCT keys), and that readout with one more of growmem's policies —
  ``net:readout_replay_dct_novelty`` (Alg. 4's novelty test: a row enters only farther than τ from every
  stored one; the replayed rows, copies of stored ones, pass), ``net:readout_replay_dct_decay`` (weight
  decay γ, rows below ε pruned, Eq. 90),
  ``net:readout_replay_dct_hybrid`` (hybrid growth: Adam trains the kept rows' w, k, ṽ) — each tuned from
  the readout's own T and β;
* order-free baselines on the same DCT codes and on raw pixels, a class-balanced buffer at the
  budget — ``knn:dct``, ``ncm:dct``, ``slda:dct``, ``knn:raw`` (they see the stream in batches of 256:
  their state does not depend on the order);
* online experience replay (:class:`growmem.continual.baselines.OnlineReplay`, Avalanche's online
  recipe) — ``er_reservoir:raw``, ``er_balanced:raw`` (8-bit images), ``er_reservoir:dct``,
  ``er_balanced:dct`` (bfloat16 DCT codes), the buffer what the budget holds beside the MLP.

**Verdicts**: per stream and budget, the best growmem method against the best other method (by mean),
paired by seed, by a Student t-test at 95 % (t with n − 1 degrees of freedom; else a tie).
``network_verdicts``: the best growing network (``net:*``) against the best online replay of raw images
(``er_*:raw``), the same way; ``policy_verdicts``: the growing readout with each of its policies (merging,
novelty, decay, hybrid) against the readout alone.
**Ablation** (``--ablation``): ``target:dct_merge`` with one policy changed at a time, paired with the
full recipe at the same seeds.

    python benchmarks/continual_frontier.py --preset smoke                  # seconds (run by the tests)
    python benchmarks/continual_frontier.py --preset cpu --streams split_mnist --seeds 1,2 --merge
    python benchmarks/continual_frontier.py --preset cpu --streams split_mnist --ablation --merge

``--merge`` adds this invocation's runs to the JSON in ``--out`` (replacing runs of the same stream,
method, budget and seed), so a ``cpu`` run splits by stream, method, budget or seed. Writes
``continual_frontier.json`` (``summary.<stream>.<budget>.<method>.{accuracy_mean, accuracy_std, ...}``,
``verdicts``, ``ablation``) and ``continual_frontier.png``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import flat_settings, newer_point, stale_point  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STREAMS = ("split_mnist", "permuted_mnist", "rotated_mnist")
PROTOCOL = "online"
PROTOCOLS = ("online", "offline")
#: the online protocol's mini-batch (stream samples a step)
ONLINE_BATCH = 10
GROWMEM_FAMILIES = ("target", "net")
_IMAGE = ("knn:raw", "er_reservoir:raw", "er_balanced:raw")
#: on the domain-incremental streams growmem keys by random projections (DCT frequencies of permuted pixels are
#: noise: kNN on DCT codes of Permuted-MNIST scored 0.39 at 1 MB where on projections it scores as the rest), and
#: the controls store what it stores; SLDA on raw pixels (a 784 x 784 covariance, 2.4 MB) fits no budget here
METHODS = {
    "split_mnist": ("target:dct_merge", "net:readout_replay_dct_merge", "net:readout_replay_dct",
                    "net:readout_replay_dct_novelty", "net:readout_replay_dct_decay", "net:readout_replay_dct_hybrid",
                    "net:replay_dct_evict_smallest", "net:replay_dct",
                    "knn:dct", "ncm:dct", "slda:dct", "er_balanced:dct") + _IMAGE,
    "permuted_mnist": ("target:proj_merge", "knn:proj", "ncm:proj", "slda:proj", "er_balanced:proj") + _IMAGE,
}
METHODS["rotated_mnist"] = METHODS["permuted_mnist"]
#: the offline protocol's methods: the best growmem learner and kNN (one pass, order-free) against the
#: budget-matched offline baselines (their model narrowed to half the budget where the recipe's does not fit)
OFFLINE_METHODS = {
    "split_mnist": ("target:dct_merge", "knn:dct", "replay_bytes", "gdumb_bytes"),
    "permuted_mnist": ("target:proj_merge", "knn:proj", "replay_bytes", "gdumb_bytes"),
}
OFFLINE_METHODS["rotated_mnist"] = OFFLINE_METHODS["permuted_mnist"]
#: (variant, overrides of target:dct_merge): one policy changed at a time; "full" is the method's own runs
#: at the same budget and seeds (the frontier's), run here only where they are missing
ABLATION = (
    ("full", {}),
    ("no merging: class-balanced random eviction", {"target.evict": "random"}),
    ("no merging: oldest rows evicted", {"target.evict": "oldest"}),
    ("no merging: most redundant rows evicted", {"target.evict": "redundant"}),
    ("T fixed at its initial value", {"target.learn_temperature": False}),
)
ABLATED = "target:dct_merge"
#: published numbers stated beside the results (not rerun)
ANCHORS = (
    {"method": "online replay (Avalanche)", "stream": "split_mnist", "protocol": "online", "samples": 1000,
     "accuracy": 0.92, "source": "ContinualAI/continual-learning-baselines, experiments/split_mnist/online_replay.py"},
    {"method": "CoPE (Avalanche)", "stream": "split_mnist", "protocol": "online", "samples": 2000, "accuracy": 0.93,
     "source": "ContinualAI/continual-learning-baselines, experiments/split_mnist/cope.py"},
    {"method": "GDumb", "stream": "split_mnist", "protocol": "offline", "samples": 500, "accuracy": 0.919,
     "source": "Prabhu et al., GDumb, ECCV 2020"},
    {"method": "GDumb", "stream": "split_mnist", "protocol": "offline", "samples": 4400, "accuracy": 0.978,
     "source": "Prabhu et al., GDumb, ECCV 2020"},
)
def _er_n_in(method) -> int:
    """The inputs of an online replay's model: 784 pixels, or its codes' size."""
    from growmem.continual.baselines import er_codes
    codes = er_codes(method, 784)
    return 784 if codes is None else codes.key_dim


#: the validation grid (``--tune``): each entry a function of (budget, stream) giving the settings tried;
#: the preset's or the rule's value sits inside every grid
def _er_widths(budget, method):
    """From an eighth of the width :func:`growmem.continual.baselines.er_width` gives ``method`` (half its
    float32 parameters in the budget) up by doublings to the widest whose parameters fit the budget at all: a
    narrower model leaves more of it to the buffer, a wider one less (the grid grew as its ends won: half the
    rule's width for raw images at 0.3 and 1 MB on Split-MNIST, twice for projections at 1 MB on Permuted-MNIST,
    four and eight times for DCT codes and projections at 3 and 15.7 MB, where the rule stops at 512)."""
    from growmem.continual.baselines import er_model_bytes, er_width

    n_in = _er_n_in(method)
    w = max(1, er_width(budget, n_in, 10) // 8)
    widths = []
    while er_model_bytes(n_in, w, 10) < budget:
        widths.append({"hidden_size": w})
        w *= 2
    return widths


def _widest_fit_reason(method: str, setting: str, value, budget) -> Optional[str]:
    """Why ``value`` on the top edge of an online replay's width grid is not extended past: the next width's
    parameters do not fit ``budget`` (``None`` where they do, or for another setting)."""
    from growmem.continual.baselines import er_model_bytes
    if setting != "hidden_size" or not method.startswith("er_") or budget is None:
        return None
    nxt = er_model_bytes(_er_n_in(method), 2 * int(value), 10)
    if nxt < budget:
        return None
    size = f"{nxt / 1e3:.0f} kB" if nxt < 1e6 else f"{nxt / 1e6:.2g} MB"
    return (f"the widest model of the grid whose float32 parameters fit {budget / 1e6:g} MB at all "
            f"({2 * int(value)} units take {size})")


#: a chosen value on its grid's edge that gains less than this over its neighbour on the validation split (one
#: seed) is not extended past: the gain has flattened
FLAT_GAIN = 0.002


def _flattened_reason(setting: str, results: list, best: int) -> Optional[str]:
    """Why ``results[best]``'s value of ``setting``, on its grid's edge, is not extended past: its validation
    accuracy gains less than :data:`FLAT_GAIN` over the next value inward (the other settings as chosen), the
    last three values along that line named; ``None`` where it gains more, or fewer than three values ran."""
    flat = [flat_settings(r["settings"]) for r in results]
    me = flat[best]
    line = sorted((f[setting], r["accuracy"]) for f, r in zip(flat, results)
                  if setting in f and r["accuracy"] is not None and r["within_budget"]
                  and all(f.get(k) == v for k, v in me.items() if k != setting))
    if len(line) < 3:
        return None
    (v2, a2), (v1, a1), (v0, a0) = line[2::-1] if me[setting] == line[0][0] else line[-3:]
    if a0 - a1 >= FLAT_GAIN:
        return None
    return (f"the gain has flattened (validation {a2:.4f}, {a1:.4f}, {a0:.4f} at {setting} {v2:g}, {v1:g}, {v0:g}, "
            f"one seed: less than {FLAT_GAIN:g} from the last step)")


def _cross(center: dict, **axes):
    """The center and, for each axis, its other values with the rest at the center (one setting moved at a
    time): ``{"overrides": {...}}`` points."""
    pts = [dict(center)] + [{**center, k: v} for k, vs in axes.items() for v in vs if v != center[k]]
    return [{"overrides": p} for p in pts]


#: the tuning document the grids read a readout's chosen T and β from (:func:`_readout_settings`): the one
#: :func:`tune` or :func:`pending_points` is working on, else the committed file under ``RESULTS``
_TUNING: dict = {"doc": None}


def _readout_settings(budget, method="net:readout_replay_dct") -> dict:
    """``method``'s readout T and β chosen on validation at ``budget`` (the preset's where it was not tuned):
    the policy presets built on ``net:readout_replay_dct`` (novelty, decay, hybrid) are tuned from there, so that
    each differs from it by its policy alone; a readout's replay rate from its own."""
    doc = _TUNING["doc"]
    tuned = _chosen(doc) if doc is not None else chosen_settings(RESULTS / "continual_frontier_tune.json")
    chosen = tuned.get("split_mnist", {}).get(str(int(budget)), {})
    over = (chosen.get(method) or {}).get("overrides", {})
    return {k: v for k, v in over.items() if k in ("readout.temperature", "readout.beta")}


def _replay_rate(method, values=(1, 2, 4, 8, 16, 32)):
    """Self-replay's rows a step (``replay.samples``; the preset's 16 tried explicitly, so the grid has both
    ends) at ``method``'s own chosen T and β: a second stage after T and β. 8, the first grid's low end, won at
    1 MB, then 4: also 2 and 1; 1 won at 0.3 MB with validation falling as the rate rose: below 1 MB also 0
    (no self-replay: the class-balanced rows alone keep the earlier classes)."""
    return lambda b, s: [{"overrides": {**_readout_settings(b, method), "replay.samples": n}}
                         for n in ((0,) if b < 1_000_000 else ()) + tuple(values)]


def _policy_grid(key, values, below=()):
    """``values`` of ``key`` from the readout's own settings; ``below``: values tried too under 0.3 MB."""
    return lambda b, s: [{"overrides": {**_readout_settings(b), key: v}}
                         for v in (tuple(below) if b < 300_000 else ()) + tuple(values)]


#: how many times a method's grid is built again in one tuning run when its later stage (the merging readout's
#: replay rate) follows a choice its points just moved: the points it did not hold before are run, then stop
STAGE_PASSES = 3
#: the growing readouts' temperatures tried beside the preset's T = 1
READOUT_T = (0.015625, 0.03125, 0.0625, 0.125, 0.25, 0.5, 2.0, 4.0)
TUNE_GRID = {
    "target:dct_merge": lambda b, s: [{"overrides": {"keys.n": n}} for n in (8, 10, 12, 14, 16)],
    # β = 0.3, the grid's low end, won at 15.7 MB and at 3 MB: there also 0.1 (chosen at 15.7 MB, on the edge
    # where its gain flattened), and 0.1 won at 3 MB with validation still rising: there also 0.03; T = 0.125,
    # the low end, won at 0.1 MB: T down to 1/64 as the merging readout's
    "net:readout_replay_dct": lambda b, s: _cross({"readout.temperature": 1.0, "readout.beta": 1.0},
                                                  **{"readout.temperature": READOUT_T,
                                                     "readout.beta": (0.3, 3.0) + ((0.1,) if b >= 3_000_000
                                                                                   else ())
                                                     + ((0.03,) if 3_000_000 <= b < 15_000_000 else ())}),
    # then self-replay's rate at the chosen T and β (a second stage: _replay_rate, STAGE_PASSES)
    "net:readout_replay_dct_merge": lambda b, s: _cross(
        {"readout.temperature": 1.0, "readout.beta": 1.0},
        **{"readout.temperature": READOUT_T, "readout.beta": (0.3, 3.0)})
    + _replay_rate("net:readout_replay_dct_merge")(b, s),
    # k = 5, the top, won at 3 MB: from there on also 10
    "knn:dct": lambda b, s: [{"overrides": {"k": k}} for k in (1, 3, 5) + ((10,) if b >= 3_000_000 else ())],
    "er_reservoir:raw": lambda b, s: _er_widths(b, "er_reservoir:raw"),
    "er_balanced:raw": lambda b, s: _er_widths(b, "er_balanced:raw"),
    "er_balanced:dct": lambda b, s: _er_widths(b, "er_balanced:dct"),
    # the growing readout with one more policy: novelty's τ (relative to ‖q‖), weight decay's γ, hybrid's Adam rate
    # τ = 0.4 and Adam's 1e-4, the grids' ends, won at 0.3 and 1 MB: novelty also 0.8 and 1.6, hybrid 3e-5 and 1e-5
    "net:readout_replay_dct_novelty": _policy_grid("policy.0.tau", (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)),
    # γ = 1e-4, the grid's end, won at 0.1 MB: there also 3e-5 and 1e-5
    "net:readout_replay_dct_decay": _policy_grid("policy.0.gamma", (0.0001, 0.0003, 0.001, 0.003, 0.01),
                                                 below=(0.00001, 0.00003)),
    "net:readout_replay_dct_hybrid": _policy_grid("hybrid.learning_rate", (0.00001, 0.00003, 0.0001, 0.0003, 0.001,
                                                                                   0.003)),
    # the domain-incremental streams' growmem learner and its controls on the same projections
    # dim 200, the top, won at 15.7 MB: there also 300
    "target:proj_merge": lambda b, s: [{"overrides": {"keys.dim": d}}
                                       for d in (50, 75, 100, 150, 200) + ((300,) if b >= 15_000_000 else ())],
    "knn:proj": lambda b, s: [{"overrides": {"k": k}} for k in (1, 3, 5) + ((10,) if b >= 3_000_000 else ())],
    "er_balanced:proj": lambda b, s: _er_widths(b, "er_balanced:proj"),
}
#: the offline protocol's validation grid: replay's epochs per experience (its recipe's default, 2 on
#: Split-MNIST and 1 on the domain-incremental streams, inside or at the lower edge), extended where its top
#: point won: below 0.3 MB also 30 and 100 (10 and then 30 won at 0.1 MB: a buffer of a few hundred images is
#: rehearsed longer), from 3 MB also 30 (10 won at 3 MB), and 100 on Rotated-MNIST at 15.7 MB (30 won there)
OFFLINE_TUNE_GRID = {
    "replay_bytes": lambda b, s: [{"epochs": e} for e in (1, 3, 10) + (
        (30, 100) if b < 300_000 or (b >= 15_000_000 and s == "rotated_mnist") else
        (30,) if b >= 3_000_000 else ())],
}
#: ``{method: {setting: {value: reason}}}``: a chosen value on its grid's edge that is not extended past, and why
#: (besides the computed reasons: the widest replay model that fits the budget, a gain that has flattened)
EDGE_REASONS = {
    "replay_bytes": {"epochs": {1: "one epoch per experience is the fewest an offline run takes"}},
    "knn:dct": {"k": {1: "one neighbour is the fewest kNN takes"}},
    "knn:proj": {"k": {1: "one neighbour is the fewest kNN takes"}},
    "net:readout_replay_dct_merge": {"replay.samples": {
        0: "no self-replay at all, the fewest rehearsals a step: the merged class-balanced rows alone keep the "
           "earlier classes"}},
    "net:readout_replay_dct_novelty": {"policy.0.tau": {
        0.025: "the smallest threshold of the grid: as tau goes to 0 the novelty test turns nothing away and the "
               "preset is the readout alone, net:readout_replay_dct, which runs beside it"}},
    "net:readout_replay_dct_hybrid": {"hybrid.learning_rate": {
        1e-05: "the smallest rate of the grid: as the rate goes to 0 hybrid growth turns off and the preset is "
               "the readout alone on float32 rows"}},
}

PRESETS = {
    "smoke": dict(seeds=[1, 2], budgets=["0.2MB", "0.5MB"], ablation_budgets=["0.2MB"],
                  streams={"split_mnist": dict(train_limit=600, test_limit=300),
                           "permuted_mnist": dict(n_experiences=2, train_limit=300, test_limit=200),
                           "rotated_mnist": dict(n_experiences=2, train_limit=300, test_limit=200)},
                  methods={"split_mnist": ("target:dct_merge", "knn:dct", "er_balanced:raw", "er_balanced:dct"),
                           "permuted_mnist": ("target:proj_merge", "er_balanced:raw"),
                           "rotated_mnist": ("target:proj_merge", "er_balanced:raw")},
                  offline_methods={"split_mnist": ("target:dct_merge", "replay_bytes", "gdumb_bytes"),
                                   "permuted_mnist": ("target:proj_merge", "replay_bytes"),
                                   "rotated_mnist": ("target:proj_merge", "replay_bytes")},
                  settings={"gdumb_bytes": {"epochs": 2}}),      # GDumb's 128 epochs take minutes
    # Permuted- and Rotated-MNIST: 10 experiences of the same 6,000 training images (a tenth of MNIST: 60,000
    # online samples in all, as Split-MNIST; 10 x 60,000 does not fit a session of 2 cores beside it), each
    # evaluated on 2,000 test images; the paper preset runs the whole of MNIST in every experience
    "cpu": dict(seeds=[1, 2, 3, 4, 5], budgets=["0.1MB", "0.3MB", "1MB", "3MB", "15.7MB"],
                ablation_budgets=["0.3MB", "1MB"],
                streams={"split_mnist": {},
                         "permuted_mnist": {"n_experiences": 10, "train_limit": 6000, "test_limit": 2000},
                         "rotated_mnist": {"n_experiences": 10, "train_limit": 6000, "test_limit": 2000}},
                methods=METHODS, offline_methods=OFFLINE_METHODS),
    "paper": dict(seeds=[1, 2, 3, 4, 5], budgets=["0.1MB", "0.3MB", "1MB", "3MB", "15.7MB"],
                  ablation_budgets=["0.3MB", "1MB"], streams={s: {} for s in STREAMS}, methods=METHODS,
                  offline_methods=OFFLINE_METHODS),
}


def _csv(text):
    return [t.strip() for t in str(text).split(",") if t.strip()]


def online_settings(method: str, stream: str) -> dict:
    """The online protocol's settings of ``method``: mini-batches of :data:`ONLINE_BATCH` (the order-free
    models are order-free: they keep their batch)."""
    from growmem.continual.methods import resolve

    m = resolve(method, stream)
    if m.kind == "avalanche":
        return {"train_mb_size": ONLINE_BATCH}
    if m.family in GROWMEM_FAMILIES:
        return {"batch_size": ONLINE_BATCH}
    return {}


def run_one(stream, method, seeds, budget, options, *, data_dir, overrides=None, label=None, progress=False,
            settings=None, split="test", protocol=PROTOCOL, on_experience=None):
    """Runs of ``method`` on ``stream`` at ``budget`` (bytes) under ``protocol`` (module docstring), tagged
    with the budget and protocol; ``settings``: the method's (tuned) settings; ``split="validation"`` for
    tuning; ``on_experience``: ``run_continual``'s hook (benchmarks/block_drift.py measures the models there)."""
    from growmem.continual.runner import run_continual

    if protocol not in PROTOCOLS:
        raise SystemExit(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    online = protocol == "online"
    settings = {**(online_settings(method, stream) if online else {}), **(settings or {})}
    if overrides:
        settings["overrides"] = {**settings.get("overrides", {}), **dict(overrides)}
    doc = run_continual(stream, [method], seeds, budget, online=online, stream_options=options, data_dir=data_dir,
                        method_settings={method: settings}, progress=progress, verbose=False, split=split,
                        final_only=True, on_experience=on_experience)
    from growmem.reporting import host

    out = []
    for r in doc["runs"]:
        r = dict(r, budget=int(budget), protocol=protocol, method=label or r["method"], base_method=method,
                 host=host())
        r.pop("accuracy_matrix_raw", None)
        out.append(r)
    return out


def _key(r):
    return (r["stream"], r["method"], r["budget"], _protocol(r), r["seed"])


def merge_runs(old, new):
    fresh = {_key(r) for r in new}
    return [r for r in old if _key(r) not in fresh] + list(new)


def unique_invocations(invocations):
    """Each invocation once, in order (a file combined twice, or one already combined into another, brings
    its history along again)."""
    seen, out = set(), []
    for i in invocations:
        key = (i["command"], i.get("finished"), i.get("seconds"))
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


def _acc(r):
    return r["summary"]["acc_mean_over_experiences"]


def _best_against_best(first: dict, second: dict, compare) -> dict:
    """The best (by mean) of the rows ``first`` against the best of ``second``, paired over their common seeds."""
    g = max(first, key=lambda m: first[m]["accuracy_mean"])
    o = max(second, key=lambda m: second[m]["accuracy_mean"])
    common = sorted(set(first[g]["seeds"]) & set(second[o]["seeds"]))
    a = [first[g]["accuracy_values"][first[g]["seeds"].index(s)] for s in common]
    b = [second[o]["accuracy_values"][second[o]["seeds"].index(s)] for s in common]
    return {"growmem": g, "other": o, "seeds": common, "difference": (sum(a) - sum(b)) / max(1, len(a)),
            "verdict": compare(a, b, paired=True)}


#: the growing readout alone, and the same readout with one more of growmem's policies (``policy_verdicts``)
POLICY_BASE = "net:readout_replay_dct"
POLICY_VARIANTS = ("net:readout_replay_dct_merge", "net:readout_replay_dct_novelty",
                   "net:readout_replay_dct_decay", "net:readout_replay_dct_hybrid")


def policy_verdicts(summary) -> dict:
    """``{stream: {budget: {variant: verdict}}}``: each of :data:`POLICY_VARIANTS` against :data:`POLICY_BASE`
    where both ran, paired over their common seeds (:func:`_best_against_best` of one row each)."""
    from growmem.reporting import compare

    out = {}
    for stream, by_budget in summary.items():
        for b, rows in by_budget.items():
            if POLICY_BASE not in rows:
                continue
            for m in POLICY_VARIANTS:
                if m in rows:
                    out.setdefault(stream, {}).setdefault(b, {})[m] = _best_against_best(
                        {m: rows[m]}, {POLICY_BASE: rows[POLICY_BASE]}, compare)
    return out


def summarise(runs, ablation_runs):
    """``(summary, verdicts, ablation, network_verdicts, offline)`` of the runs (module docstring): the first
    two and ``network_verdicts`` (the best growing network, ``net:*``, against the best online replay of raw
    images, ``er_*:raw``) of the online runs; ``offline``: ``{"summary", "verdicts"}`` of the offline runs
    (empty without them)."""
    from growmem.reporting import compare, mean_std

    summary, verdicts, network_verdicts = _by_stream_and_budget([r for r in runs if _protocol(r) == "online"])
    off_summary, off_verdicts, _ = _by_stream_and_budget([r for r in runs if _protocol(r) == "offline"])
    offline = {"summary": off_summary, "verdicts": off_verdicts} if off_summary else {}
    ablation = {}
    for stream in dict.fromkeys(r["stream"] for r in ablation_runs):
        for budget in sorted({r["budget"] for r in ablation_runs if r["stream"] == stream}):
            here = [r for r in ablation_runs if r["stream"] == stream and r["budget"] == budget]
            if not any(r["method"] == "full" for r in here):      # the method's own runs at this budget
                here = [dict(r, method="full") for r in runs if (r["stream"], r["method"], r["budget"], _protocol(r))
                        == (stream, ABLATED, budget, "online")] + here
            by = {v: {r["seed"]: _acc(r) for r in here if r["method"] == v} for v in dict.fromkeys(r["method"] for r in here)}
            full = by.get("full", {})
            rows = {}
            for v, vals in by.items():
                seeds = sorted(vals)
                ms = mean_std([vals[s] for s in seeds])
                row = {"accuracy_mean": ms["mean"], "accuracy_std": ms["std"], "seeds": seeds,
                       "bytes_peak": max(r["summary"]["bytes_in_use_peak"] for r in here if r["method"] == v)}
                common = sorted(set(seeds) & set(full))
                if v != "full" and common:
                    row["vs_full"] = compare([vals[s] for s in common], [full[s] for s in common], paired=True)
                    row["difference_vs_full"] = sum(vals[s] - full[s] for s in common) / len(common)
                rows[v] = row
            ablation.setdefault(stream, {})[str(budget)] = rows
    return summary, verdicts, ablation, network_verdicts, offline


def _protocol(run) -> str:
    return run.get("protocol", PROTOCOL)


def _by_stream_and_budget(runs):
    """``(summary, verdicts, network_verdicts)`` of runs of one protocol."""
    from growmem.continual.methods import resolve
    from growmem.reporting import compare, mean_std

    summary, verdicts, network_verdicts = {}, {}, {}
    for stream in dict.fromkeys(r["stream"] for r in runs):
        for budget in sorted({r["budget"] for r in runs if r["stream"] == stream}):
            rows = {}
            here = [r for r in runs if r["stream"] == stream and r["budget"] == budget]
            for m in dict.fromkeys(r["method"] for r in here):
                rs = sorted((r for r in here if r["method"] == m), key=lambda r: r["seed"])
                ms = mean_std([_acc(r) for r in rs])
                peak = max(r["summary"]["bytes_in_use_peak"] for r in rs)
                rows[m] = {"accuracy_mean": ms["mean"], "accuracy_std": ms["std"], "accuracy_values": ms["values"],
                           "seeds": [r["seed"] for r in rs], "bytes_peak": peak,
                           "within_budget": all(r["summary"].get("within_budget", peak <= budget) for r in rs),
                           "wall_s": mean_std([r["summary"]["wall_seconds"] for r in rs])["mean"],
                           "growmem": resolve(m, stream).family in GROWMEM_FAMILIES,
                           "description": rs[0].get("description")}
            summary.setdefault(stream, {})[str(budget)] = rows
            ok = {m: r for m, r in rows.items() if r["within_budget"]}
            gm = {m: r for m, r in ok.items() if r["growmem"]}
            other = {m: r for m, r in ok.items() if not r["growmem"]}
            if gm and other:
                verdicts.setdefault(stream, {})[str(budget)] = _best_against_best(gm, other, compare)
            nets = {m: r for m, r in gm.items() if resolve(m, stream).family == "net"}
            raw_replay = {m: r for m, r in other.items() if m.startswith("er_") and m.endswith(":raw")}
            if nets and raw_replay:
                network_verdicts.setdefault(stream, {})[str(budget)] = _best_against_best(nets, raw_replay, compare)
    return summary, verdicts, network_verdicts


def plot(payload, out: Path):
    """``continual_frontier.png``: final accuracy against the budget (log x), one line per method (mean ±
    std over seeds), one panel per stream and protocol (a row each)."""
    from growmem.reporting import pyplot, save_figure

    plt = pyplot()
    parts = [(PROTOCOL, payload["summary"])] + ([("offline", payload["offline"]["summary"])]
                                                if payload["offline"] else [])
    streams = list(dict.fromkeys(st for _, summ in parts for st in summ))
    fig, axes = plt.subplots(len(parts), max(1, len(streams)), figsize=(6.5 * max(1, len(streams)), 5 * len(parts)),
                             squeeze=False)
    for (protocol, summ), stream, ax in ((p, st, axes[i][j]) for i, p in enumerate(parts)
                                        for j, st in enumerate(streams)):
        if stream not in summ:
            ax.set_axis_off()
            continue
        by_budget = summ[stream]
        methods = list(dict.fromkeys(m for rows in by_budget.values() for m in rows))
        for k, m in enumerate(methods):
            pts = sorted((int(b), rows[m]) for b, rows in by_budget.items() if m in rows)
            gm = pts[0][1]["growmem"]
            ax.errorbar([b / 1e6 for b, _ in pts], [r["accuracy_mean"] for _, r in pts],
                        yerr=[r["accuracy_std"] for _, r in pts], marker="o" if gm else "s", ms=4, capsize=2,
                        lw=2 if gm else 1, ls="-" if gm else "--",
                        color=f"C{k}" if len(methods) <= 10 else plt.cm.tab20(k % 20), label=m)
        ax.set_xscale("log")
        ax.set_xlabel("memory budget (MB, peak bytes in use checked)")
        ax.set_ylabel("final accuracy, mean over test experiences")
        ax.set_title(f"{stream}, {protocol}" + (f" (batch {ONLINE_BATCH}, one pass)" if protocol == "online" else
                                                " (epochs per experience)"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure(fig, out / "continual_frontier.png")
    plt.close(fig)


def chosen_settings(path) -> dict:
    """``{stream: {budget: {method: settings}}}`` chosen by ``--tune`` (``{}`` without a tuning file)."""
    if not Path(path).is_file():
        return {}
    return _chosen(json.loads(Path(path).read_text()))


def _chosen(doc: dict) -> dict:
    return {st: {b: {m: e.get("chosen") for m, e in ms.items()} for b, ms in bs.items()}
            for st, bs in doc["streams"].items()}


def on_edge(points, best: int) -> list:
    """The settings of ``points[best]`` that sit at the smallest or largest value the grid tried for them
    (settings tried at one value only are not an edge): ``[]`` when the chosen point is inside the grid."""
    flat = [flat_settings(p) for p in points]
    out = []
    for k, v in flat[best].items():
        tried = {f[k] for f in flat if k in f}
        if len(tried) > 1 and v in (min(tried), max(tried)):
            out.append(k)
    return out


def _tuned_entry(method: str, results: list, seed: int, protocol: str, digest=None, budget=None) -> dict:
    """A method's grid at one stream and ``budget``: its points, the best one within the budget (never a point run
    on another version of the preset, whose ``digest`` is given), whether that sits on the grid's edge (and the
    reason, where EDGE_REASONS gives one, an online replay's next width would not fit the budget, or the gain has
    flattened)."""
    ok = [i for i, r in enumerate(results) if r["accuracy"] is not None and r["within_budget"]
          and not (digest is not None and stale_point(r, digest))]
    best = max(ok, key=lambda i: results[i]["accuracy"]) if ok else None
    edge = None if best is None else on_edge([r["settings"] for r in results], best)
    chosen = None if best is None else flat_settings(results[best]["settings"])
    return {"results": results, "chosen": None if best is None else results[best]["settings"], "on_edge": edge,
            "seed": seed, "protocol": protocol,
            "edge_reasons": {k: r for k in edge or [] for r in [EDGE_REASONS.get(method, {}).get(k, {}).get(
                chosen[k]) or _widest_fit_reason(method, k, chosen[k], budget) or _flattened_reason(k, results, best)]
                             if r}}


def grids(cfg, stream: str, protocol: str, methods=None) -> dict:
    """The tuning grids of ``stream``'s methods under ``protocol`` in preset ``cfg`` (of ``methods`` alone, a
    comma-separated list, if given): a grid is tuned only on the streams whose methods it is."""
    listed = cfg["methods" if protocol == "online" else "offline_methods"][stream]
    return {m: g for m, g in (TUNE_GRID if protocol == "online" else OFFLINE_TUNE_GRID).items()
            if m in listed and (not methods or m in _csv(methods))}


def pending_points(doc: dict, cfg) -> list:
    """What tuning has left in preset ``cfg``: each stream, budget and protocol's grids (:func:`grids`, the policy
    presets' from the readouts' choices in ``doc``) against the points the tuning file ``doc`` holds.
    ``[{"stream", "budget", "protocol", "method", "never_run", "stale", "of"}]`` for each grid with a point never
    run or run only on another version of the method's preset file (``stale_point``: the choice ignores it), as
    :func:`_tuned_entry` counts them."""
    from growmem.continual.methods import preset_digest, resolve
    from growmem.units import parse_size

    out = []
    with _tuning_doc(doc):
        for protocol in PROTOCOLS:
            for stream in cfg["streams"]:
                for b in map(parse_size, cfg["budgets"]):
                    for m, grid in grids(cfg, stream, protocol).items():
                        digest = preset_digest(resolve(m, stream))
                        ran = {}
                        for r in doc["streams"].get(stream, {}).get(str(b), {}).get(m, {}).get("results", []):
                            k = json.dumps(r["settings"], sort_keys=True)
                            ran[k] = ran.get(k, False) or not stale_point(r, digest)
                        want = [json.dumps(p, sort_keys=True) for p in grid(b, stream)]
                        never, stale = sum(w not in ran for w in want), sum(ran.get(w) is False for w in want)
                        if never or stale:
                            out.append({"stream": stream, "budget": b, "protocol": protocol, "method": m,
                                        "never_run": never, "stale": stale, "of": len(want)})
    return out


@contextlib.contextmanager
def _tuning_doc(doc: dict):
    """The grids read the readouts' choices from ``doc`` inside the block (:data:`_TUNING`)."""
    before = _TUNING["doc"]
    _TUNING["doc"] = doc
    try:
        yield
    finally:
        _TUNING["doc"] = before


def tune(args, cfg, streams, seeds, budgets):
    """Every TUNE_GRID method's grid on the validation split (a tenth of each class's training images held
    out; the test split is not read) at every budget, with the first of ``seeds`` (the preset's seed 1: its
    class order, permutations and rotations; the benchmark's test runs use the test split); the chosen point,
    and whether it is on the grid's edge.
    With ``--merge`` a point already in the tuning file (same method, budget and settings) is read back, not
    run again: a grid extended past its edge runs only its new points. With ``--combine FILES`` nothing runs:
    the points of tuning files made apart join the file in ``--out`` (a point tried in both: ``newer_point``'s)
    and each grid's choice is made again over all of them. A growmem point is read back unless it ran on
    another version of the preset file (``stale_point``: a changed preset reruns its grid), as the choice and
    :func:`pending_points` count it. The policy presets' grids take the readouts' T and β from the file being
    made (its choices as this run makes them); it is written once, with its ``pending`` points."""
    from growmem.reporting import write_json

    path = args.out / "continual_frontier_tune.json"
    doc = json.loads(path.read_text()) if ((args.merge or args.combine is not None) and path.is_file()) \
        else {"streams": {}, "invocations": []}
    if args.combine is not None:
        streams = []
    with _tuning_doc(doc):     # the policy presets' grids from the readouts' choices as this run makes them
        _tune_grids(args, cfg, streams, seeds, budgets, doc)
    doc["pending"] = pending_points(doc, cfg)
    write_json(path, doc)
    print(f"wrote {path}")
    return doc


def _tune_grids(args, cfg, streams, seeds, budgets, doc):
    """:func:`tune`'s work on ``doc``: run the grids' points not read back, or combine ``args.combine``."""
    from growmem.continual.methods import preset_digest, resolve

    t0 = time.perf_counter()
    for stream in streams:
        for b in budgets:
            for m, grid in grids(cfg, stream, args.protocol, args.methods).items():
                results = []
                digest = preset_digest(resolve(m, stream))      # a point tried on another version of the preset reruns
                before = {json.dumps(r["settings"], sort_keys=True): r for r in
                          doc["streams"].get(stream, {}).get(str(b), {}).get(m, {}).get("results", [])
                          if r["accuracy"] is not None and not stale_point(r, digest)}   # as the choice counts
                seen = set()
                for _ in range(STAGE_PASSES):   # a later stage's points follow the choice the earlier ones make
                    todo = [p for p in grid(b, stream) if json.dumps(p, sort_keys=True) not in seen]
                    if not todo:
                        break
                    for point in todo:
                        key = json.dumps(point, sort_keys=True)
                        seen.add(key)
                        if key in before:          # a grid that extends: tried points are read back
                            results.append(before[key])
                            continue
                        try:
                            r = run_one(stream, m, seeds, b, cfg["streams"][stream], data_dir=args.data_dir,
                                        settings=point, split="validation", protocol=args.protocol)[0]
                        except ValueError as e:
                            results.append({"settings": point, "accuracy": None, "why": str(e)})
                            continue
                        results.append({"settings": point, "accuracy": _acc(r),
                                        "bytes_peak": r["summary"]["bytes_in_use_peak"],
                                        "within_budget": r["summary"]["within_budget"], "preset_digest": digest,
                                        "ran_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                        print(f"tune {stream} {m} at {b / 1e6:g} MB {point}: validation {_acc(r):.4f} "
                              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                    doc["streams"].setdefault(stream, {}).setdefault(str(b), {})[m] = \
                        _tuned_entry(m, results, seeds[0], args.protocol, digest, b)
    invocations = doc["invocations"]
    others = [json.loads(Path(f).read_text()) for f in args.combine or []]             # grids tuned apart
    if args.combine == []:          # no file: the file's own entries, their choices and reasons made again
        others = [json.loads(json.dumps(doc))]
    for other in others:
        for stream, bs in other["streams"].items():
            for b, ms in bs.items():
                for m, e in ms.items():
                    here = doc["streams"].setdefault(stream, {}).setdefault(b, {})
                    digest = preset_digest(resolve(m, stream))
                    points = {}
                    for r in here.get(m, {}).get("results", []) + e["results"]:
                        k = json.dumps(r["settings"], sort_keys=True)
                        if k not in points or newer_point(r, points[k], digest):
                            points[k] = r
                    here[m] = _tuned_entry(m, list(points.values()), e["seed"], e["protocol"], digest, int(b))
        invocations = invocations + other["invocations"]
    invocation = {"command": "python benchmarks/continual_frontier.py " + " ".join(sys.argv[1:]),
                  "seconds": time.perf_counter() - t0, "load_average_after": list(os.getloadavg())}
    if args.combine is not None:
        invocation["combined"] = [str(f) for f in args.combine]
    doc["invocations"] = unique_invocations(invocations + [invocation])
    doc.update(benchmark="continual_frontier_tune", preset=args.preset, split="validation",
               summary={st: {b: {m: {"chosen": e["chosen"], "on_edge": e["on_edge"]} for m, e in ms.items()}
                             for b, ms in bs.items()} for st, bs in doc["streams"].items()})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for continual_frontier.json and its plot")
    ap.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (or set GROWMEM_DATA)")
    ap.add_argument("--streams", default=None, help="comma-separated subset of the preset's streams")
    ap.add_argument("--methods", default=None, help="comma-separated methods (default: each stream's)")
    ap.add_argument("--budgets", default=None, help="comma-separated budgets, e.g. 0.3MB,1MB (default: the preset's)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    ap.add_argument("--ablation", action="store_true", help=f"run the ablation of {ABLATED} (at the ablation budgets "
                                                             f"unless --budgets) instead of the methods")
    ap.add_argument("--protocol", choices=PROTOCOLS, default=PROTOCOL,
                    help="online (the main table: one pass, batches of 10) or offline (epochs per experience)")
    ap.add_argument("--tune", action="store_true", help="choose the settings of the methods of TUNE_GRID (OFFLINE_TUNE_GRID "
                                                         "with --protocol offline) on the validation split (first seed) at "
                                                         "every budget, into continual_frontier_tune.json")
    ap.add_argument("--merge", action="store_true", help="add these runs to the JSON already in --out")
    ap.add_argument("--combine", type=Path, nargs="*", default=None, metavar="JSON",
                    help="merge these continual_frontier.json files (run apart) into --out's, run nothing, summarise; "
                         "with --tune, these continual_frontier_tune.json files; with no file, --out's own file is "
                         "summarised again (with --tune: its choices, edge reasons and pending points made again)")
    args = ap.parse_args(argv)
    from growmem.runtime import compilation_cache
    compilation_cache()     # seeds and methods after the first load the programs they share instead of compiling

    from growmem.units import parse_size
    from growmem.reporting import RULE, write_json

    cfg = PRESETS[args.preset]
    streams = _csv(args.streams) if args.streams else list(cfg["streams"])
    bad = [s for s in streams if s not in cfg["streams"]]
    if bad:
        raise SystemExit(f"unknown stream(s) {bad}; the {args.preset} preset runs {', '.join(cfg['streams'])}")
    seeds = [int(s) for s in _csv(args.seeds)] if args.seeds else list(cfg["seeds"])
    budgets = [parse_size(b) for b in (_csv(args.budgets) if args.budgets else
                                       cfg["ablation_budgets"] if args.ablation else cfg["budgets"])]
    t0 = time.perf_counter()
    if args.tune:
        return tune(args, cfg, streams, seeds[:1], budgets)
    tuned = chosen_settings(args.out / "continual_frontier_tune.json")
    new, new_ablation, skipped = [], [], []
    units = []
    path = args.out / "continual_frontier.json"
    old_runs = json.loads(path.read_text())["runs"] if (args.merge and path.is_file()) else []
    combined = {"runs": [], "ablation_runs": [], "invocations": []}
    for doc in map(lambda f: json.loads(Path(f).read_text()), args.combine or []):
        for k in ("runs", "ablation_runs"):
            combined[k] = merge_runs(combined[k], doc.get(k, []))
        combined["invocations"] += doc.get("invocations", [])
    if args.combine is not None:
        streams = []
    for stream in streams:
        if args.ablation:
            for b in budgets:
                have = {r["seed"] for r in old_runs if (r["stream"], r["method"], r["budget"]) == (stream, ABLATED, b)}
                units += [(stream, b, ABLATED, v, o) for v, o in ABLATION if v != "full" or not set(seeds) <= have]
        else:
            methods = _csv(args.methods) if args.methods else \
                list(cfg["methods" if args.protocol == "online" else "offline_methods"][stream])
            units += [(stream, b, m, None, None) for b in budgets for m in methods]
    for i, (stream, b, m, variant, over) in enumerate(units):
        t = time.perf_counter()
        try:
            runs = run_one(stream, m, seeds, b, cfg["streams"][stream], data_dir=args.data_dir, overrides=over,
                           label=variant, settings={**cfg.get("settings", {}).get(m, {}),
                                                    **(tuned.get(stream, {}).get(str(b), {}).get(m) or {})},
                           protocol=PROTOCOL if variant else args.protocol)
        except ValueError as e:               # e.g. a model alone larger than the budget: said, not hidden
            skipped.append({"stream": stream, "method": variant or m, "budget": b, "why": str(e)})
            print(f"[{i + 1}/{len(units)}] {stream} {variant or m} at {b / 1e6:g} MB: not run ({e})", file=sys.stderr)
            continue
        (new_ablation if variant else new).extend(runs)
        done = time.perf_counter() - t0
        accs = ", ".join(f"{_acc(r):.4f}" for r in runs)
        print(f"[{i + 1}/{len(units)}] {stream} {variant or m} at {b / 1e6:g} MB: {accs} "
              f"({time.perf_counter() - t:.0f} s; ETA {done / (i + 1) * (len(units) - i - 1):.0f} s)",
              file=sys.stderr, flush=True)

    old = json.loads(path.read_text()) if ((args.merge or args.combine is not None) and path.is_file()) else {}
    old = {"runs": merge_runs(old.get("runs", []), combined["runs"]),
           "ablation_runs": merge_runs(old.get("ablation_runs", []), combined["ablation_runs"]),
           "invocations": old.get("invocations", []) + combined["invocations"]}
    runs = merge_runs(old["runs"], new)
    ablation_runs = merge_runs(old["ablation_runs"], new_ablation)
    summary, verdicts, ablation, network_verdicts, offline = summarise(runs, ablation_runs)
    invocation = {"command": "python benchmarks/continual_frontier.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "seconds": time.perf_counter() - t0, "load_average_after": list(os.getloadavg()),
                  "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "skipped": skipped}
    if args.combine is not None:
        invocation["combined"] = [str(f) for f in args.combine]
    payload = {"benchmark": "continual_frontier", "preset": args.preset, "protocol": PROTOCOL,
               "config": {"online_batch": ONLINE_BATCH, "streams": cfg["streams"], "rule": RULE,
                          "methods": {s: list(m) for s, m in cfg["methods"].items()},
                          "offline_methods": {s: list(m) for s, m in cfg["offline_methods"].items()},
                          "ablation": [[v, o] for v, o in ABLATION], "ablated": ABLATED,
                          "anchors": list(ANCHORS)},
               "summary": summary, "verdicts": verdicts, "network_verdicts": network_verdicts,
               "policy_verdicts": policy_verdicts(summary), "ablation": ablation,
               "invocations": unique_invocations(old["invocations"] + [invocation]), "runs": runs,
               "ablation_runs": ablation_runs, "offline": offline}
    out = write_json(path, payload)
    plot(payload, args.out)

    parts = [(f"{PROTOCOL} (batch {ONLINE_BATCH})", summary, verdicts)] + \
        ([("offline (epochs per experience)", offline["summary"], offline["verdicts"])] if offline else [])
    for (protocol, summ, calls), stream in ((p, st) for p in parts for st in p[1]):
        by_budget = summ[stream]
        print(f"\n{stream}, {protocol}: final accuracy, mean ± std over seeds")
        for b, rows in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
            v = calls.get(stream, {}).get(b)
            print(f"  {int(b) / 1e6:g} MB" + (f" — {v['growmem']} vs {v['other']}: {v['difference']:+.4f} ({v['verdict']})"
                                              if v else ""))
            for m, r in sorted(rows.items(), key=lambda kv: -kv[1]["accuracy_mean"]):
                over = "" if r["within_budget"] else "  OVER BUDGET"
                print(f"    {m:22s} {r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f}  n={len(r['seeds'])}  "
                      f"{r['bytes_peak'] / 1e6:.3f} MB ({r['bytes_peak'] / int(b):.2f} of the budget){over}")
    for stream, by_budget in network_verdicts.items():
        for b, v in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
            print(f"growing network vs online replay of raw images, {stream} at {int(b) / 1e6:g} MB: {v['growmem']} vs "
                  f"{v['other']}: {v['difference']:+.4f} ({v['verdict']})")
    for stream, by_budget in ablation.items():
        for b, rows in by_budget.items():
            print(f"\nablation of {ABLATED}, {stream} at {int(b) / 1e6:g} MB:")
            for v, r in rows.items():
                vs = f"  {r['difference_vs_full']:+.4f} vs full ({r['vs_full']})" if "vs_full" in r else ""
                print(f"    {v:45s} {r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f}{vs}")
    print(f"wrote {out} and {args.out / 'continual_frontier.png'}")
    return payload


if __name__ == "__main__":
    main()
