"""``growmem repro``: the verdict rule on hand-made inputs (``core.beats``, ``ordering``, ``within``,
the sample-size estimate, the hybrid goal and "graceful" rules, Table 8's claims), the sweep's
grid extension and edge reasons on a made-up score, every experiment's smoke preset end to end
(JSON summary + PNG: seeds, per-seed values, mean ± std, and verdicts recomputed independently
from the stored values), the registry's errors, ``--list`` and ``--table``."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

import growmem.repro as repro
from growmem.app.cli import main
from growmem.repro import core, hybrid_capacity, multi_epoch, newton_steps, single_pass, table
from growmem.repro.core import CONTRADICTED, INCONCLUSIVE, REPRODUCED
from growmem.train import NonFiniteLossError

NAMES = repro.names()


def rule(a, b, *, margin=0.0, higher=True):
    """The stated rule, written independently of growmem: the paired per-seed differences in the
    claim's direction, less the margin, by scipy's one-sample t-test (two-sided, 95 %): reproduced when
    significant and positive, contradicted when significant and negative, else inconclusive (no
    spread: the sign decides)."""
    from scipy import stats
    d = np.asarray(a, float) - np.asarray(b, float)
    d = (d if higher else -d) - margin
    if d.std(ddof=1) == 0:
        return REPRODUCED if d.mean() > 0 else CONTRADICTED if d.mean() < 0 else INCONCLUSIVE
    r = stats.ttest_1samp(d, 0.0)
    if r.pvalue < 0.05:
        return REPRODUCED if d.mean() > 0 else CONTRADICTED
    return INCONCLUSIVE


# ---- the verdict rule on hand-made inputs ---------------------------------------------------------

def test_beats_is_reproduced_contradicted_or_inconclusive_by_a_paired_t_test():
    a, b = [0.90, 0.91, 0.92], [0.80, 0.80, 0.81]          # differences .10, .11, .11: t ≈ 32
    assert core.beats(a, b)["verdict"] == REPRODUCED
    assert core.beats(b, a)["verdict"] == CONTRADICTED
    noisy = [0.51, 0.49, 0.53]                              # differences .01, -.01, .03 from 0.50: t = 0.87
    part = core.beats(noisy, [0.50, 0.50, 0.50])
    assert part["verdict"] == INCONCLUSIVE and part["comparison"] == "tie"
    assert part["n_needed"] == _least_n(0.01, 0.02)         # 18: 0.01 > t_{n-1} · 0.02 / √n
    assert part["difference"] == pytest.approx(0.01)
    assert core.beats([0.52, 0.53, 0.51, 0.52, 0.52], [0.5] * 5)["verdict"] == REPRODUCED   # t = 6.3
    assert core.beats([0.52, 0.49, 0.55], [0.5] * 3)["verdict"] == INCONCLUSIVE           # t = 1.15
    # t = 3.5 with 3 seeds: beyond 2 standard errors, but short of t_{2, 0.975} = 4.30 — a tie at 95 %
    three = [0.51, 0.53, 0.52]
    assert 2 < np.mean(np.subtract(three, 0.5)) / (np.std(np.subtract(three, 0.5), ddof=1) / math.sqrt(3)) < 4.3
    assert core.beats(three, [0.5] * 3)["verdict"] == INCONCLUSIVE
    for x in ([0.52, 0.53, 0.51, 0.52, 0.52], [0.52, 0.49, 0.55], noisy, three, [0.51, 0.53, 0.52, 0.52]):
        assert core.beats(x, [0.5] * len(x))["verdict"] == rule(x, [0.5] * len(x))


def _least_n(d, s, unpaired=False):
    """The least n with d > t_{df} s / √n (df = n − 1, or 2n − 2 unpaired), by scipy's quantiles."""
    from scipy import stats
    n = 2
    while not d > stats.t.ppf(0.975, 2 * n - 2 if unpaired else n - 1) * s / math.sqrt(n):
        n += 1
    return n


def test_beats_lower_is_better_margins_and_a_fixed_reference():
    loss_a, loss_b = [1.0, 1.1, 0.9], [2.0, 2.2, 1.9]
    assert core.beats(loss_a, loss_b, higher=False)["verdict"] == REPRODUCED
    assert core.beats(loss_a, loss_b)["verdict"] == CONTRADICTED
    # a margin in the claim's direction: a must exceed b by more than it
    a, b = [0.60, 0.61, 0.59], [0.50, 0.50, 0.50]           # ahead by .10 ± .01
    assert core.beats(a, b, margin=0.05)["verdict"] == REPRODUCED
    assert core.beats(a, b, margin=0.15)["verdict"] == CONTRADICTED
    assert core.beats(a, b, margin=0.10)["verdict"] == INCONCLUSIVE
    assert core.beats(a, b, margin=0.10)["n_needed"] is None    # no difference left: not estimable
    # a scalar is a reference number every seed is compared with
    assert core.beats(a, 0.55)["verdict"] == REPRODUCED
    assert core.beats([0.1, 0.1, 0.1], 0.2, higher=False)["verdict"] == REPRODUCED   # no spread: the means
    # one value per side tells nothing
    one = core.beats([0.9], [0.1])
    assert one["verdict"] == INCONCLUSIVE and one["comparison"] == "untested"
    with pytest.raises(ValueError, match="one value per seed"):
        core.beats([1, 2, 3], [1, 2])


def test_seeds_needed_against_a_hand_computation():
    # paired differences 1, 2, 3: mean 2, sd 1 -> n = 3 (t_{2} = 4.30: 2 > 4.30/√3 = 2.48? no; ...)
    assert core.seeds_needed([1, 2, 3], [0, 0, 0]) == _least_n(2.0, 1.0) == 4
    # unpaired: s² = s_a² + s_b² = 1 + 1, d = 1, 2n − 2 degrees of freedom
    assert core.seeds_needed([1, 2, 3], [0, 1, 2], paired=False) == _least_n(1.0, math.sqrt(2), unpaired=True) == 9
    assert core.seeds_needed([1, 1, 1], [0, 0, 0]) is None      # no spread
    assert core.seeds_needed([1], [0]) is None


def test_ordering_needs_every_pair_and_names_the_seeds_that_would_decide():
    v = {"gws": [0.90, 0.91, 0.92], "rbf": [0.88, 0.89, 0.90], "sgd": [0.80, 0.80, 0.81],
         "adam": [0.89, 0.91, 0.88], "muon": [0.95, 0.96, 0.955]}
    assert core.ordering(v, ["gws", "rbf"], ["sgd"])["verdict"] == REPRODUCED
    c = core.ordering(v, ["gws", "rbf"], ["sgd", "muon"])
    assert c["verdict"] == CONTRADICTED and len(c["parts"]) == 4
    c = core.ordering(v, ["gws"], ["sgd", "adam"])           # gws vs adam: .01, 0, .04 -> t = 1.2
    assert c["verdict"] == INCONCLUSIVE
    adam = next(p for p in c["parts"] if p["b"] == "adam")
    assert c["n_needed"] == adam["n_needed"] == core.seeds_needed(v["gws"], v["adam"])
    assert core.ordering(v, ["gws"], ["nosuch"])["verdict"] == INCONCLUSIVE
    assert core.ordering({"a": [1.0, 1.1, 0.9], "b": [2.0, 2.2, 1.9]}, ["a"], ["b"], higher=False)["verdict"] \
        == REPRODUCED
    for w in v:
        for l in v:
            if w != l:
                assert core.ordering(v, [w], [l])["verdict"] == rule(v[w], v[l]), (w, l)


def test_within_a_tolerance_and_the_combinations():
    exact = [0.70, 0.72, 0.71]
    assert core.within([0.701, 0.721, 0.711], exact, 0.005)["verdict"] == REPRODUCED      # .001 ± 0
    assert core.within([0.72, 0.74, 0.73], exact, 0.005)["verdict"] == CONTRADICTED        # .02 above
    assert core.within([0.68, 0.70, 0.69], exact, 0.005)["verdict"] == CONTRADICTED        # .02 below
    assert core.within([0.705, 0.715, 0.72], exact, 0.005)["verdict"] == INCONCLUSIVE     # .005 ± .005
    r, c, i = ({"verdict": v, "n_needed": n} for v, n in ((REPRODUCED, None), (CONTRADICTED, None),
                                                          (INCONCLUSIVE, 7)))
    assert core.combine([r, r], rule="")["verdict"] == REPRODUCED
    assert core.combine([r, i], rule="")["verdict"] == INCONCLUSIVE
    assert core.combine([r, i], rule="")["n_needed"] == 7
    assert core.combine([r, c, i], rule="")["verdict"] == CONTRADICTED
    assert core.combine([c, i], rule="", mode="any")["verdict"] == INCONCLUSIVE
    assert core.combine([c, r], rule="", mode="any")["verdict"] == REPRODUCED
    assert core.combine([c, c], rule="", mode="any")["verdict"] == CONTRADICTED
    assert core.verdict(i) == "inconclusive at this size (≈ 7 seeds would decide it)"
    assert core.verdict({"verdict": INCONCLUSIVE, "n_needed": None}) == "inconclusive at this size"
    assert core.verdict(c) == "contradicted" and core.verdict(r) == "reproduced"


def test_hybrid_goal_and_graceful_rules():
    full = {"accuracy": [0.980, 0.982, 0.979]}
    low = {"tau": 0.8, "capacity_fraction": [0.10, 0.11, 0.10], "accuracy": [0.970, 0.973, 0.969]}
    mid = {"tau": 0.7, "capacity_fraction": [0.30, 0.31, 0.29], "accuracy": [0.975, 0.977, 0.975]}
    c = hybrid_capacity.goal_and_graceful(full, [mid, low])
    assert c["goal"]["verdict"] == REPRODUCED          # τ=0.8: 10 % capacity, ~1 point lost
    assert c["graceful"]["verdict"] == REPRODUCED      # 10 % < 30 % < full, each step lower
    assert [(p["a"], p["b"]) for p in c["graceful"]["parts"]] == [("tau=0.7", "tau=0.8"), ("full growth", "tau=0.7")]
    # the low-capacity point tests higher than the middle one: not graceful; and it loses 5 points: no goal
    worse = {**mid, "accuracy": [0.930, 0.931, 0.929]}
    c = hybrid_capacity.goal_and_graceful(full, [worse, low])
    assert c["graceful"]["verdict"] == CONTRADICTED
    lost = {**low, "accuracy": [0.930, 0.932, 0.929]}
    assert hybrid_capacity.goal_and_graceful(full, [lost])["goal"]["verdict"] == CONTRADICTED
    # a noisy tie between neighbours decides nothing
    tie = {**mid, "accuracy": [0.972, 0.968, 0.975]}
    assert hybrid_capacity.goal_and_graceful(full, [tie, low])["graceful"]["verdict"] == INCONCLUSIVE


def test_newton_steps_claims():
    acc = {"5": [0.69, 0.692, 0.688], "10": [0.713, 0.712, 0.714], "exact": [0.712, 0.7125, 0.7128]}
    c = newton_steps.claims_of(acc)
    assert c["five_short"]["verdict"] == REPRODUCED and c["ten_match_exact"]["verdict"] == REPRODUCED
    c = newton_steps.claims_of({**acc, "exact": [0.73, 0.731, 0.729]})
    assert c["ten_match_exact"]["verdict"] == CONTRADICTED


# ---- a unit of the cache killed mid-way goes on from its checkpoint -----------------------------------

def test_a_growing_run_killed_mid_way_goes_on_from_its_checkpoint_to_the_uninterrupted_report(tmp_path):
    import jax

    from growmem.layers import GrowingSpec, ResidualGrowingNet
    from growmem.repro import runs
    from growmem.train import Trainer

    data = core.synthetic_images(128, 64, d=64, seed=0)

    def trainer():
        spec = GrowingSpec.make("weighted_softmax", temperature=1.0, eta=3.0, beta=1.0, init="random", init_rows=16)
        return Trainer(ResidualGrowingNet(d_out=10, n_blocks=0, readout=spec), loss="cross_entropy",
                       sample_input=data.x[:16], rng=jax.random.key(0))

    kw = dict(batch=16, epochs=2, seed=3, curve_points=4, curve_test=64, label="t")   # 16 steps, a curve every 4
    ref = runs.run_growing(_ctx(tmp_path / "ref"), trainer(), data, **kw)

    class Killed(Exception):
        pass

    def kill(step):
        if step == 10:
            raise Killed

    unit = tmp_path / "unit"
    with pytest.raises(Killed):     # checkpoints after steps 4 and 8 (no wait between them), killed after 10
        runs.run_growing(_ctx(tmp_path / "a"), trainer(), data, **kw, unit=unit, unit_every_s=0, after_step=kill)
    ctx = _ctx(tmp_path / "b")
    told = []
    ctx.update = told.append
    out = runs.run_growing(ctx, trainer(), data, **kw, unit=unit, unit_every_s=0)
    assert told[0] == 8 and sum(told) == 16       # the checkpoint's 8 steps, then 8 trained again
    for k in ("accuracy", "curve", "epoch_train_loss", "rows", "steps"):
        assert out[k] == ref[k], k                # bitwise: the batches are a function of the step


# ---- the sweep: grids extended until they contain their optimum -----------------------------------

def _ctx(tmp_path):
    return core.Context("fake", "smoke", tmp_path, progress=False)


def test_sweep_extends_a_grid_until_the_best_is_inside(tmp_path):
    seen = []

    def fn(hp):   # peak at lr = 1e-2
        seen.append(hp["lr"])
        return {"accuracy": -(math.log10(hp["lr"]) + 2) ** 2}

    sw = core.sweep(_ctx(tmp_path), "m", core.grid({"lr": [1e-4, 1e-3]}), fn, extend={"lr": 3})
    assert seen == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
    assert sw["best"]["hyper"]["lr"] == pytest.approx(1e-2) and sw["edges"] == {}
    # one extension only: the best is still at the edge, and the JSON says why
    sw = core.sweep(_ctx(tmp_path / "b"), "m", core.grid({"lr": [1e-4, 1e-3]}), fn, extend={"lr": 1})
    e = sw["edges"]["lr"]
    assert e["edge"] == "high" and e["value"] == pytest.approx(1e-2) and "extension limit" in e["reason"]


def test_a_sweep_extending_its_grid_grows_the_progress_total_with_it(tmp_path, monkeypatch):
    """The bar's total counts the grid given; each value added beyond it adds its steps, so the total
    ends equal to the steps run (the ETA never ran past 100 %)."""
    monkeypatch.setenv("GROWMEM_PROGRESS", "1")
    ctx = core.Context("fake", "smoke", tmp_path, progress=True)
    steps = 7
    ctx.start(2 * steps)

    def fn(hp):   # peak at lr = 1e-2: two values beyond the grid
        ctx.update(steps)
        return {"accuracy": -(math.log10(hp["lr"]) + 2) ** 2}

    core.sweep(ctx, "m", core.grid({"lr": [1e-4, 1e-3]}), fn, steps=steps, extend={"lr": 3})
    assert ctx.bar.n == 4 * steps and ctx.bar.total == ctx.bar.n
    ctx.finish()


def test_sweep_edge_reasons_divergence_bounds_and_momentum_spacing(tmp_path):
    def fn(hp):
        if hp["lr"] > 5e-3:
            raise NonFiniteLossError("the training loss became nan at step 3")
        return {"accuracy": hp["lr"] + hp["momentum"]}

    sw = core.sweep(_ctx(tmp_path), "m", core.grid({"lr": [1e-4, 1e-3], "momentum": [0.0, 0.6, 0.9]}), fn,
                    extend={"lr": 2, "momentum": {"steps": 1, "scale": "log1m"}}, reasons={"wd": "unused"})
    lrs = sorted({r["hyper"]["lr"] for r in sw["runs"]})
    assert lrs == pytest.approx([1e-4, 1e-3, 1e-2])
    assert "diverged" in sw["edges"]["lr"]["reason"]
    moms = sorted({r["hyper"]["momentum"] for r in sw["runs"]})
    assert moms == pytest.approx([0.0, 0.6, 0.9, 0.975])    # 1 − (1 − 0.9)² / (1 − 0.6)
    assert sw["edges"]["momentum"]["value"] == pytest.approx(0.975)
    assert "extension limit" in sw["edges"]["momentum"]["reason"]
    # an axis the preset does not extend carries the preset's reason; a log axis cannot pass 0
    sw = core.sweep(_ctx(tmp_path / "b"), "m", core.grid({"lr": [1e-4, 1e-3], "wd": [0.0, 0.1]}),
                    lambda hp: {"accuracy": -hp["wd"] - hp["lr"]}, extend={"wd": 2}, reasons={"lr": "Table 12's grid"})
    assert sw["edges"]["lr"]["reason"] == "Table 12's grid" and sw["edges"]["lr"]["edge"] == "low"
    assert "bound" in sw["edges"]["wd"]["reason"]


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory):
    """One folder gathering the smoke JSONs of this module's runs (for the ``--table`` test); session-scoped,
    since an xdist worker interleaves other modules' tests and would tear a module-scoped one down between."""
    return tmp_path_factory.mktemp("repro_smoke")


def _run_smoke(name, out, shared=None):
    doc = repro.run(name, "smoke", out=out, progress=False)
    if shared is not None:
        shutil.copy(Path(out) / f"{name}.json", Path(shared) / f"{name}.json")
    return doc


def _fraction(x, what):
    assert isinstance(x, (int, float)) and not isinstance(x, bool), f"{what}: {x!r} is not a number"
    assert math.isfinite(x) and 0.0 <= x <= 1.0, f"{what}: {x!r} is not a fraction in [0, 1]"


def _values(s, key):
    return s["metrics"][key]["values"]


def _check_common(s, cfg):
    """Seeds, per-seed values with their mean and sample std, and an overall verdict that follows
    from the claims' (all must hold)."""
    seeds = cfg["seeds"]
    assert s["seeds"] == seeds and len(seeds) >= 2
    assert s["metrics"]
    for k, m in s["metrics"].items():
        assert m["n"] == len(m["values"]) == len(seeds), k
        assert m["mean"] == pytest.approx(np.mean(m["values"])), k
        assert m["std"] == pytest.approx(np.std(m["values"], ddof=1)), k
    verdicts = [c["verdict"] for c in s["claims"].values()]
    assert verdicts and all(v in core.VERDICTS for v in verdicts)
    expect = (REPRODUCED if all(v == REPRODUCED for v in verdicts) else
              CONTRADICTED if CONTRADICTED in verdicts else INCONCLUSIVE)
    assert s["verdict"] == expect
    assert s["claim_reproduced"] == (expect == REPRODUCED)


def _check_parts(claim, values, *, higher=True, margin=0.0):
    """Every part of an ordering claim against the independent rule on the stored per-seed values."""
    for p in claim["parts"]:
        assert p["verdict"] == rule(values[p["a"]], values[p["b"]], higher=higher, margin=margin), p


def _check_single_pass(s, cfg):
    models = cfg["models"]
    assert set(s["rows"]) == set(models) == set(s["accuracy"])
    for m in models:
        for v in _values(s, f"accuracy/{m}"):
            _fraction(v, m)
    mlps = [m for m in single_pass.MLPS if m in models]
    for m in single_pass.GROWING:   # every growing net stored at least its D0 rows
        if m in models:
            assert s["rows"][m] > 0, m
    for m in mlps:
        assert s["rows"][m] == 0, m
        assert set(s["grid_edges"][m]) <= set(cfg["grids"][m[4:]])
    assert s["rows"]["knn"] == cfg["n_train"]
    vals = {m: _values(s, f"accuracy/{m}") for m in models}
    _check_parts(s["claims"]["growing_beats_mlps"], vals)
    assert len(s["claims"]["growing_beats_mlps"]["parts"]) == 2 * len(mlps)


def _check_hybrid_capacity(s, cfg):
    assert [p["tau"] for p in s["points"]] == cfg["taus"]
    full = {"accuracy": _values(s, "accuracy/full_growth")}
    pts = [{"tau": t, "accuracy": _values(s, f"accuracy/tau={t:.4g}"),
            "capacity_fraction": _values(s, f"capacity_fraction/tau={t:.4g}")} for t in cfg["taus"]]
    for p in pts:
        assert all(0 < c <= 1 for c in p["capacity_fraction"])
    again = hybrid_capacity.goal_and_graceful(full, pts)
    assert {k: c["verdict"] for k, c in again.items()} == {k: c["verdict"] for k, c in s["claims"].items()}


def _check_newton_steps(s, cfg):
    assert set(s["accuracy_by_steps"]) == {"1", "5", "10", "exact"}
    r = s["residual_by_steps"]     # k Newton-Schulz steps approach the inverse: 10 steps nearer than 1
    assert r["10"] < r["1"]
    acc = {k: _values(s, f"accuracy/synthetic/k={k}") for k in ("5", "10")}
    _check_parts(s["claims"]["five_short"], acc)


def _check_depth_temperature(s, cfg):
    assert set(s["accuracy"]) == {str(L) for L in cfg["depths"]}
    assert sum(len(a) for a in s["accuracy"].values()) == len(cfg["depths"]) * len(cfg["temperatures"])
    for L, a in s["accuracy"].items():   # the best T of a depth has the highest mean
        assert s["best_T_by_depth"][L] == float(max(a, key=a.get))
    drop = s["claims"]["linearisation_severe"]
    for p, (L, T) in zip(drop["parts"], ((L, f"{s['best_T_by_depth'][L]}") for L in s["accuracy"])):
        assert p["verdict"] == rule(_values(s, f"accuracy/L={L}/T={T}"), _values(s, f"linearised_accuracy/L={L}/T={T}"),
                                    margin=0.10)


def _check_parametric_gap(s, cfg):
    assert s["width"] > 0
    assert s["claims"]["gws_higher_test_accuracy"]["verdict"] == rule(_values(s, "test/gws"),
                                                                      _values(s, "test/parametric_softmax"))
    assert s["claims"]["parametric_gap_widens"]["verdict"] == rule(_values(s, "gap/parametric_softmax"),
                                                                   _values(s, "gap_first/parametric_softmax"))


def _check_delta_decay(s, cfg):
    t = {k: _values(s, f"test_accuracy/{k}") for k in ("plain", "delta", "weight_decay")}
    assert s["claims"]["delta_improves"]["verdict"] == rule(t["delta"], t["plain"], margin=0.005)
    assert s["claims"]["delta_beats_weight_decay"]["verdict"] == rule(t["delta"], t["weight_decay"])


def _check_teacher_student(s, cfg):
    models = ("growing_weighted_softmax", "parametric_softmax", "reference_mlp")
    vals = {m: _values(s, f"relative_test_loss/{m}") for m in models}
    assert all(math.isfinite(v) and v >= 0 for vs in vals.values() for v in vs)
    _check_parts(s["claims"]["gws_below_parametric"], vals, higher=False)
    _check_parts(s["claims"]["mlp_lowest"], vals, higher=False)
    assert [c["samples"] for c in s["by_checkpoint"]] == cfg["checkpoints"]
    assert s["samples"] == cfg["steps"] * cfg["batch"] == cfg["checkpoints"][-1]
    # the test loss relative to each seed's target variance
    for m in models:
        rel, raw = vals[m], _values(s, f"test_loss/{m}")
        np.testing.assert_allclose(np.array(raw) / np.array(s["target_variance"]["values"]), rel, rtol=1e-9)


def _check_learned_temperature(s, cfg):
    assert set(s["learned_by_init"]) == {str(float(t)) for t in cfg["inits"]}
    for t, v in s["learned_by_init"].items():
        assert len(v["temperatures"]) == len(cfg["seeds"])
        for temps in v["temperatures"]:
            assert set(temps) == {f"block_{i}" for i in range(cfg["n_blocks"])} | {"readout"}
            assert all(math.isfinite(x) and x > 0 for x in temps.values())
    best = max(s["swept"], key=s["swept"].get)
    for t in s["learned_by_init"]:
        assert s["by_start"][t]["verdict"] == rule(_values(s, f"accuracy/learned/T0={t}"),
                                                   _values(s, f"accuracy/swept/T={best}"), margin=-0.005)
    means = [s["learned_by_init"][t]["accuracy"]["mean"] for t in s["learned_by_init"]]
    assert s["spread"]["range"] == pytest.approx(max(means) - min(means))


def _check_multi_epoch(s, cfg):
    models = set(cfg["models"])
    assert set(s["accuracy"]) == set(s["test_accuracy_by_epoch"]) == set(s["train_loss_by_epoch"]) == models
    for m in models:
        by_epoch = s["test_accuracy_by_epoch"][m]
        assert len(by_epoch) == cfg["epochs"] == len(s["train_loss_by_epoch"][m]), m
        for a in by_epoch:
            _fraction(a, f"test_accuracy_by_epoch.{m}")
        assert by_epoch[-1] == pytest.approx(s["accuracy"][m])   # the last epoch's evaluation is the whole test set
    # a growing net stores every sample once per epoch in each of its L + 1 layers, after its D0 rows
    # (GWS: B random rows, F.3; RBF: none)
    seen = cfg["epochs"] * (cfg["n_train"] // cfg["batch"]) * cfg["batch"]
    d0 = {"weighted_softmax": cfg["batch"], "rbf": 0}
    assert s["rows"] == {m: (cfg["growing_n_blocks"] + 1) * (d0[m] + seen) for m in multi_epoch.GROWING}
    vals = {m: _values(s, f"accuracy/{m}") for m in models}
    _check_parts(s["claims"]["accuracy"], vals)


def _check_vit_ffn(s, cfg):
    # every block stores its D0 (B random rows) and one row per token of every image it saw
    h, w, _ = cfg["image_shape"]
    tokens = (h // cfg["patch"]) * (w // cfg["patch"]) + 1
    assert s["tokens"] == tokens
    seen = (cfg["n_train"] // cfg["batch"]) * cfg["batch"]
    assert s["rows"] == {f"ffn_{i}": cfg["batch"] + seen * tokens for i in range(cfg["n_blocks"])}
    assert s["params"]["gws_vit"] < s["params"]["vit"]       # the FFNs hold no parameters
    assert s["accuracy_by_seed"]["vit"] == _values(s, "accuracy/vit")
    assert s["claims"]["gws_vit_higher"]["verdict"] == rule(_values(s, "accuracy/gws_vit"), _values(s, "accuracy/vit"))


CHECKS = {"single-pass": _check_single_pass, "multi-epoch": _check_multi_epoch, "hybrid-capacity": _check_hybrid_capacity,
          "newton-steps": _check_newton_steps, "depth-temperature": _check_depth_temperature,
          "parametric-gap": _check_parametric_gap, "delta-decay": _check_delta_decay,
          "teacher-student": _check_teacher_student, "learned-temperature": _check_learned_temperature,
          "vit-ffn": _check_vit_ffn}


def test_every_experiment_has_a_check():
    assert set(CHECKS) == set(NAMES)


#: the smoke runs and the table test share one xdist worker (``--dist loadgroup``), so the table reads the
#: JSONs the runs left instead of running every experiment again in another process
SMOKE_GROUP = pytest.mark.xdist_group("repro_smoke")


@SMOKE_GROUP
@pytest.mark.parametrize("name", NAMES)
def test_smoke_preset_writes_summary_and_plot(name, tmp_path, smoke_dir):
    doc = _run_smoke(name, tmp_path, smoke_dir)
    json_path, png = tmp_path / f"{name}.json", tmp_path / f"{name}.png"
    assert doc["paths"] == {"json": str(json_path), "png": str(png)}
    assert png.stat().st_size > 1000
    data = json.loads(json_path.read_text())
    assert list(data)[0] == "experiment" and data["experiment"] == name and data["preset"] == "smoke"
    assert data["command"] == f"growmem repro {name} --preset smoke"
    assert data["summary"] == doc["summary"]
    assert not (tmp_path / f"{name}.partial.jsonl").exists()   # the resume cache is removed when done
    _check_common(data["summary"], data["config"])
    CHECKS[name](data["summary"], data["config"])


def test_unknown_experiment_and_preset_are_explained(tmp_path):
    with pytest.raises(repro.UnknownExperimentError) as e:
        repro.run("no-such-experiment", "smoke", out=tmp_path, progress=False)
    msg = str(e.value)
    assert "'no-such-experiment'" in msg and all(n in msg for n in NAMES)
    assert isinstance(e.value, repro.ReproError)

    with pytest.raises(repro.UnknownReproPresetError) as e:
        repro.run("single-pass", "fast", out=tmp_path, progress=False)
    assert "'fast'" in str(e.value) and "smoke, cpu, paper" in str(e.value)

    with pytest.raises(repro.ReproError, match="not a setting of this preset.*n_train"):
        repro.run("newton-steps", "smoke", out=tmp_path, progress=False, overrides={"n_trian": 64})
    assert not any(tmp_path.iterdir())   # refused before any work


def test_cli_list_names_every_experiment(capsys):
    assert main(["repro", "--list"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert listed == NAMES


def test_cli_unknown_experiment_is_one_line_and_the_listing(capsys):
    assert main(["repro", "no-such-experiment", "--preset", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("growmem repro: unknown experiment 'no-such-experiment'")
    assert all(n in err for n in NAMES)
    assert main(["repro", "single-pass", "--preset", "fast"]) == 2
    assert "valid presets: smoke, cpu, paper" in capsys.readouterr().err


@SMOKE_GROUP
def test_cli_table_from_the_smoke_jsons(smoke_dir, capsys):
    for name in NAMES:   # when run alone: the smoke runs the parametrized test would have left
        if not (smoke_dir / f"{name}.json").exists():
            _run_smoke(name, smoke_dir)
    capsys.readouterr()
    assert main(["repro", "--table", "--out", str(smoke_dir)]) == 0
    printed = capsys.readouterr().out
    text = (smoke_dir / "README_TABLE.md").read_text()
    assert text.rstrip() in printed
    lines = text.splitlines()
    head = lines.index("| " + " | ".join(table.HEADER) + " |")
    assert lines[head + 1] == "|---|---|---|---|---|---|---|"
    rows = [line for line in lines[head + 2:] if line.startswith("| ")]
    assert "Not run here" not in text
    seen = set()
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 7, row
        name, claim, paper, measured, n, verdict, command = cells
        seen.add(name)
        assert claim and paper and measured.startswith("(smoke preset: a pipeline check")
        assert " ± " in measured
        doc = json.loads((smoke_dir / f"{name}.json").read_text())
        assert n == str(len(doc["summary"]["seeds"]))
        # a row's verdict is one of its JSON's claims' verdicts (the overall one follows from them: _check_common)
        words = {c["verdict"] for c in doc["summary"]["claims"].values()}
        said = verdict.split(" (")[0]
        assert (INCONCLUSIVE if said == "inconclusive at this size" else said) in words, (name, verdict, words)
        assert command == f"`growmem repro {name} --preset smoke`"
    assert seen == set(NAMES)


@SMOKE_GROUP
def test_table_verdicts_come_from_the_claims_and_old_jsons_are_not_given_one(smoke_dir, tmp_path):
    src = smoke_dir / "vit-ffn.json"
    if not src.exists():
        _run_smoke("vit-ffn", smoke_dir)
    doc = json.loads(src.read_text())
    doc["summary"]["claims"]["gws_vit_higher"].update(verdict=INCONCLUSIVE, n_needed=11)
    (tmp_path / "vit-ffn.json").write_text(json.dumps(doc))
    old = {"experiment": "delta-decay", "preset": "cpu", "command": "growmem repro delta-decay --preset cpu",
           "summary": {"test_accuracy": {"plain": 0.8}, "claim_reproduced": False}}
    (tmp_path / "delta-decay.json").write_text(json.dumps(old))
    # an earlier version that already listed its seed, without per-metric values, is not given one either
    old_seeded = {"experiment": "newton-steps", "preset": "cpu", "command": "growmem repro newton-steps --preset cpu",
                  "summary": {"seeds": [0], "accuracy_by_steps": {"5": 0.87}, "claim_reproduced": True}}
    (tmp_path / "newton-steps.json").write_text(json.dumps(old_seeded))
    rows = {r[0]: r for r in table.rows(tmp_path)}
    assert rows["newton-steps"][5] == "not decided: rerun the command"
    assert rows["vit-ffn"][5] == "inconclusive at this size (≈ 11 seeds would decide it)"
    assert rows["vit-ffn"][4] == "2"
    assert rows["delta-decay"][4] == "1" and rows["delta-decay"][5] == "not decided: rerun the command"


def test_an_out_folder_in_use_and_another_presets_result_are_refused(tmp_path, capsys):
    """``--out`` is held by one invocation (a second would empty the first's resume cache), and a run never
    replaces a JSON of another preset (a smoke run over the committed cpu result): both refused before any work,
    in one line, the files untouched."""
    import subprocess
    import sys

    held = tmp_path / "held"
    partial = held / "newton-steps.partial.jsonl"
    held.mkdir()
    partial.write_text('{"key": "a", "preset": "smoke", "result": {}}\n')
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from growmem import locks; "
                               f"locks.acquire({str(held)!r}, 'x'); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(repro.ReproError, match="in use by another growmem process"):
            repro.run("newton-steps", "smoke", out=held, progress=False)
        assert main(["repro", "newton-steps", "--preset", "smoke", "--out", str(held)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("growmem repro: ") and "in use" in err and len(err.strip().splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()
    assert partial.read_text() == '{"key": "a", "preset": "smoke", "result": {}}\n'   # the cache is untouched

    cpu = tmp_path / "cpu"
    cpu.mkdir()
    doc = '{"experiment": "newton-steps", "preset": "cpu", "summary": {}}'
    (cpu / "newton-steps.json").write_text(doc)
    with pytest.raises(repro.ReproError, match="holds the cpu preset's result.*another --out"):
        repro.run("newton-steps", "smoke", out=cpu, progress=False)
    (cpu / "delta-decay.json").write_text("not json")
    with pytest.raises(repro.ReproError, match="is not a growmem repro result"):
        repro.run("delta-decay", "smoke", out=cpu, progress=False)
    assert (cpu / "newton-steps.json").read_text() == doc and (cpu / "delta-decay.json").read_text() == "not json"
    assert sorted(p.name for p in cpu.iterdir()) == ["delta-decay.json", "newton-steps.json"]


def test_the_committed_repro_table_is_what_the_renderer_makes_of_the_committed_jsons():
    """benchmarks/results/repro/README_TABLE.md is current: rerunning an experiment (or changing how the
    table is made) without `growmem repro --table --out benchmarks/results/repro` fails here."""
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "repro"
    assert (committed / "README_TABLE.md").read_text() == table.table_text(committed)
    jsons = sorted(p.stem for p in committed.glob("*.json"))
    assert jsons and all(f"| {n} |" in (committed / "README_TABLE.md").read_text() for n in jsons)


# ---- the parametric runs go through growmem.train.fit ---------------------------------------------

def _images(n=96, d=12, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x, xt = rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(48, d)).astype(np.float32)
    y, yt = rng.integers(0, classes, n), rng.integers(0, classes, 48)
    return core.Images("toy", x, y, xt, yt, x, xt, classes, "none")


def test_a_parametric_run_is_the_hand_written_loop_of_its_steps(tmp_path):
    """run_parametric (fit driving the model) against a loop written here: the same batches (growmem.train.Batches
    reshuffled every epoch), make_step's update with step t's key fold_in(key, t), the mean loss of every epoch."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    from growmem.repro import runs
    from growmem.train import Batches

    data, model, tx = _images(), nn.Dense(3), optax.adam(0.05)
    ctx = core.Context("t", "smoke", tmp_path, progress=False)
    got = runs.run_parametric(ctx, model, tx, data, batch=16, epochs=2, seed=3, curve_points=4, curve_test=48)
    key = jax.random.key(3)
    params = model.init(key, jnp.asarray(data.x[:16]))["params"]
    opt, step = tx.init(params), runs.make_step(model, tx)
    batches, losses = Batches(data.x, data.y, 16, rng=jax.random.key(3), shuffle=True), []
    for t in range(1, 13):
        xb, yb = batches(t)
        params, opt, loss = step(params, opt, jnp.asarray(xb), jnp.asarray(yb), jax.random.fold_in(key, t))
        losses.append(float(loss))
    acc = float(np.mean(np.asarray(model.apply({"params": params}, data.xt)).argmax(-1) == data.yt))
    assert got["steps"] == 12 and got["accuracy"] == acc
    assert np.allclose(got["epoch_train_loss"], [np.mean(losses[:6]), np.mean(losses[6:])], rtol=0, atol=1e-6)
    assert [c[0] for c in got["curve"]] == [3 * 16, 6 * 16, 9 * 16, 12 * 16]
    # only the epochs asked for are evaluated
    two = runs.run_parametric(ctx, model, tx, data, batch=16, epochs=2, seed=3, eval_epochs=[2], curve_test=48)
    assert [c[0] for c in two["curve"]] == [12 * 16] and two["accuracy"] == acc


def test_a_parametric_run_whose_loss_diverges_names_the_step(tmp_path):
    import optax
    from flax import linen as nn

    from growmem.repro import runs

    data = _images()
    data.x[40:] = np.nan                      # more than half the samples hold NaN inputs
    ctx = core.Context("t", "smoke", tmp_path, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"the training loss became nan at step \d+ \(last finite loss: "):
        runs.run_parametric(ctx, nn.Dense(3), optax.sgd(0.1), data, batch=16, epochs=1, seed=0)
