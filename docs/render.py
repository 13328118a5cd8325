"""The measured results, rendered from the committed JSONs under ``benchmarks/results/``.

One small function per results file, registered in ``RENDERERS`` with the file(s) it reads.
The same functions serve

* the documentation site: ``mkdocs.yml`` loads this file as a hook, and a page line
  ``<!-- results:NAME -->`` becomes NAME's markdown at build time;
* the README: ``python docs/render.py --readme`` rewrites every block between
  ``<!-- begin:KIND:NAME -->`` and ``<!-- end:KIND:NAME -->`` (KIND ``results``: a renderer;
  KIND ``example``: the code of ``examples/NAME.py``); ``--check`` only says whether they are current;
* ``python docs/render.py NAME`` prints one renderer's markdown.

A renderer reads its JSON by plain indexing: a key that is missing or renamed (an older or newer
schema) raises ``RenderError`` naming the renderer, its files and the key, never an empty block.
This file lives outside the growmem package, which never imports it.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Tuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"

PLACEHOLDER = re.compile(r"^<!-- results:([a-z0-9_]+) -->$", re.M)
BLOCK = re.compile(r"(<!-- begin:(results|example):([a-z0-9_]+) -->\n)(.*?)(<!-- end:\2:\3 -->)", re.S)


class RenderError(RuntimeError):
    """A results file does not have what its renderer reads (or no such renderer/example)."""


class Renderer(NamedTuple):
    name: str
    files: Tuple[str, ...]          # relative to benchmarks/results/; a folder is passed as a Path
    fn: Callable[..., str]

    def paths(self):
        return [RESULTS / f for f in self.files]


RENDERERS: Dict[str, Renderer] = {}


def renderer(name: str, *files: str):
    """Register ``fn(*docs) -> markdown`` as NAME, reading ``files`` (in that order)."""
    def register(fn):
        if name in RENDERERS:
            raise RenderError(f"renderer {name!r} registered twice ({RENDERERS[name].fn.__name__}, {fn.__name__})")
        RENDERERS[name] = Renderer(name, files, fn)
        return fn
    return register


def load(path: Path):
    if path.is_dir():
        return path
    if not path.exists():
        raise RenderError(f"{path.relative_to(ROOT)} does not exist: run the benchmark that writes it "
                          f"(its command is in the how-to pages) or drop its renderer")
    return json.loads(path.read_text())


def render(name: str, docs=None) -> str:
    """NAME's markdown from the committed files (or from ``docs``, the already loaded inputs)."""
    if name not in RENDERERS:
        raise RenderError(f"no renderer {name!r}; registered: {', '.join(sorted(RENDERERS))}")
    r = RENDERERS[name]
    docs = [load(p) for p in r.paths()] if docs is None else docs
    try:
        text = r.fn(*docs)
    except (KeyError, IndexError, TypeError) as e:
        raise RenderError(f"renderer {name!r} ({r.fn.__name__}) on {', '.join(r.files)}: missing or changed "
                          f"key {e!r}; the file's schema changed: update {r.fn.__name__} in docs/render.py") from e
    if not text.strip():
        raise RenderError(f"renderer {name!r} rendered nothing")
    return text.rstrip("\n") + "\n"


# ---- formatting ---------------------------------------------------------------------------------

def pct(x) -> str:
    return f"{100 * x:.2f} %"


def times(x) -> str:
    return f"{x:.2f}×"


def mb(n_bytes) -> str:
    return f"{n_bytes / 1e6:.2f}"


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def source(path: str, doc, *, command: bool = True) -> str:
    """The provenance line under a rendered block: file, preset, command (for the files that
    record theirs) and date."""
    env = doc["environment"]
    date = env["date"] if "date" in env else env["written_at"]
    cmd = f", `{doc['command']}`" if command else ""
    return f"\n*From `benchmarks/results/{path}` (preset `{doc['preset']}`{cmd}; {date[:10]}).*\n"


# ---- continual learning -------------------------------------------------------------------------

def _acc(r, key="accuracy") -> str:
    """``mean ± std (n seeds)`` of a summary row (sample std over seeds)."""
    m, sd, n = r[f"{key}_mean"], r[f"{key}_std"], r["seeds"]
    return f"{m:.4f} ± {sd:.4f} ({n} seeds)" if n > 1 else f"{m:.4f} (1 seed)"


def _growmem_methods(rows):
    return [m for m in rows if m.startswith(("target:", "net:"))]


@renderer("continual", "continual.json")
def render_continual(doc) -> str:
    cfg = doc["config"]
    out = ""
    for st, rows in doc["summary"].items():
        ref = cfg["methods"][st][0]
        order = sorted(rows, key=lambda m: -rows[m]["accuracy_mean"])
        out += (f"\n**{st}**, offline (epochs per experience as tuned on validation) ({len(order)} methods; `vs {ref}`: better / worse by a paired Student t-test at 95 %, "
                "else a tie; `–`: one seed, not compared)\n\n")
        out += table(["method", "what it is", "final accuracy", "forgetting", f"vs `{ref}`", "peak MB", "wall s"],
                     [[f"`{m}`", rows[m]["description"], _acc(rows[m]),
                       "–" if rows[m]["forgetting"] is None else f"{rows[m]['forgetting']:.4f}",
                       rows[m]["vs_reference"] or "–",
                       mb(rows[m]["bytes"]) + ("" if rows[m]["within_budget"] is not False else " (over)"),
                       f"{rows[m]['wall_s']:.0f}"] for m in order])
        for m, r in doc["iid"][st].items():   # order-free methods: no cost by construction
            if m in _growmem_methods(rows):
                out += (f"\n`{m}` on the shuffled stream (one experience of every class): "
                        f"{r['acc_stream_weighted']:.4f} on the whole test set; the class-incremental order costs it "
                        f"{r['order_cost']:.4f} (shuffled vs ordered: {r['shuffled_vs_ordered']}, "
                        f"{len(r['order_seeds'])} seeds).\n")
        for m, pts in doc["sweep"][st].items():
            out += f"\nAccuracy against the budget, `{m}` (first seed):\n\n" + table(
                ["budget MB", "final accuracy", "peak MB in use"],
                [[mb(p["budget"]), f"{p['accuracy']:.4f}", mb(p["bytes"])] for p in sorted(pts, key=lambda p: p["budget"])])
    loads = [max(i["load_average_after"]) for i in doc["invocations"]]
    out += (f"\nBudget {mb(cfg['budget_bytes'])} MB for every method; stored samples counted as "
            f"`{cfg['replay_dtype']}`; {', '.join(cfg['one_seed'])}: one seed. Hyperparameters: "
            f"`{Path(cfg['tuned']).name if cfg['tuned'] else 'presets and recipes'}`. "
            f"{len(doc['invocations'])} invocations merged"
            + (f" (load average after them up to {max(loads):.1f}: wall times are a rough guide)" if loads else "")
            + ".\n")
    return out + source("continual.json", {**doc, "command": doc["invocations"][-1]["command"]})


#: the comparisons the README states: (stream, first, second, what they are)
CONTINUAL_FINDINGS = (
    ("split_mnist", "knn:dct", "target:dct", "a nearest-neighbour classifier against the target memory, same keys"),
    ("split_mnist", "net:replay_dct", "replay_bytes", "the growing network against replay with as many samples as the budget holds"),
    ("split_mnist", "net:replay_dct", "target:dct", "the growing network against the target memory"),
)


@renderer("continual_findings", "continual.json", "continual_ablation.json")
def render_continual_findings(doc, ablation) -> str:
    """The README's comparisons, decided like every verdict (a paired Student t-test at 95 %)."""
    from growmem.reporting import compare

    rows = []
    for st, a, b, what in CONTINUAL_FINDINGS:
        s = doc["summary"][st]
        if s[a]["seeds"] > 1 and s[a]["seeds"] == s[b]["seeds"]:
            call = compare(s[a]["accuracy_values"], s[b]["accuracy_values"], paired=True)
            said = {"better": "first higher", "worse": "first lower", "tie": "a tie (the t-test at 95 % does not tell them apart)"}[call]
        else:
            said = "not compared (one seed)"
        rows.append([f"{st}: {what}", f"`{a}` {_acc(s[a])}", f"`{b}` {_acc(s[b])}", said])
    for st, ms in doc["iid"].items():
        for m, r in ms.items():
            if m.startswith("net:"):
                rows.append([f"{st}: what the class-incremental order costs the growing network",
                             f"ordered {doc['summary'][st][m]['acc_stream_weighted']:.4f}",
                             f"shuffled {r['acc_stream_weighted']:.4f} (both: the whole test set, mean of "
                             f"{len(r['order_seeds'])} seeds)",
                             f"{r['order_cost']:.4f} (shuffled vs ordered: {r['shuffled_vs_ordered']})"])
    for part, variants in ablation["summary"].items():
        if not part.startswith("drifting"):
            continue
        base = next(iter(variants))
        for v, r in list(variants.items())[1:]:
            if v != "drift detector":   # the README states the policy's claim; the docs show every variant
                continue
            for k in ("acc_current", "prequential"):
                rows.append([f"{part}: {v} against {base} ({k})", f"{r[f'{k}_mean']:.4f} ± {r[f'{k}_std']:.4f}",
                                 f"{variants[base][f'{k}_mean']:.4f} ± {variants[base][f'{k}_std']:.4f}",
                                 {"better": "first higher", "worse": "first lower", "tie": "a tie",
                                  "untested": "untested"}[r[f"{k}_vs_full"]]])
    return table(["comparison (final accuracy; drifting: accuracy on the current teacher, prequential)",
                  "first", "second", "verdict"], rows)


def _mean_sd(r) -> str:
    """``mean ± std (n)`` of a frontier row (``seeds`` a list)."""
    n = len(r["seeds"])
    return f"{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} ({n})" if n > 1 else f"{r['accuracy_mean']:.4f} (1)"


def _frontier_tables(summary, verdicts, doc, protocol) -> str:
    """One table per stream of a frontier protocol: every method at every budget, then the verdict row."""
    out = ""
    for st, by_budget in summary.items():
        budgets = sorted(by_budget, key=int)
        methods = list(dict.fromkeys(m for b in budgets for m in by_budget[b]))
        methods.sort(key=lambda m: (not any(by_budget[b][m]["growmem"] for b in budgets if m in by_budget[b]), m))
        rows = []
        for m in methods:
            cells = []
            for b in budgets:
                r = by_budget[b][m] if m in by_budget[b] else None
                cells.append("–" if r is None else _mean_sd(r) + ("" if r["within_budget"] else " (over)"))
            gm = any(by_budget[b][m]["growmem"] for b in budgets if m in by_budget[b])
            rows.append([f"**`{m}`**" if gm else f"`{m}`"] + cells)
        verdict = []
        calls = verdicts[st] if st in verdicts else {}
        for b in budgets:
            v = calls[b] if b in calls else None
            verdict.append("–" if v is None else f"`{v['growmem']}` vs `{v['other']}`: {v['difference']:+.4f}, "
                                                  f"**{v['verdict']}** ({len(v['seeds'])} seeds)")
        rows.append(["best growmem vs best other"] + verdict)
        out += (f"\n**{st}**, {protocol}; final accuracy, mean ± std (seeds); growmem's methods in bold; "
                f"{doc['config']['rule']})\n\n")
        out += table(["method"] + [f"{mb(int(b))} MB" for b in budgets], rows)
    return out


@renderer("continual_frontier", "continual_frontier.json")
def render_continual_frontier(doc) -> str:
    """Per stream: every method's final accuracy (mean ± std over seeds, n) at every budget, the verdict
    of the best growmem method against the best other one, and the ablation."""
    out = _frontier_tables(doc["summary"], doc["verdicts"], doc,
                           f"{doc['protocol']} (batches of {doc['config']['online_batch']}, one pass")
    if doc["offline"]:
        out += _frontier_tables(doc["offline"]["summary"], doc["offline"]["verdicts"], doc,
                                "offline (epochs per experience: `replay_bytes` chosen on validation, `gdumb_bytes` "
                                "its recipe's 128; growmem and kNN one pass")
    if doc["network_verdicts"]:
        out += ("\n**The growing network against online replay of raw images** (the best `net:*` method against "
                "the best `er_*:raw`, paired by seed)\n\n") + render_frontier_networks(doc)
    for st, by_budget in doc["ablation"].items():
        for b, rows in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
            out += f"\n**Ablation of `{doc['config']['ablated']}`**, {st} at {mb(int(b))} MB (paired by seed)\n\n"
            out += table(["variant", "final accuracy", "vs full", "difference", "peak MB"],
                         [[v, _mean_sd(r), "–" if v == "full" else r["vs_full"],
                           "–" if v == "full" else f"{r['difference_vs_full']:+.4f}",
                           mb(r["bytes_peak"])] for v, r in rows.items()])
    out += "\nPublished anchors, not rerun (their models and memory counted differently):\n\n" + table(
        ["method", "stream", "protocol", "samples stored", "accuracy", "source"],
        [[a["method"], a["stream"], a["protocol"], f"{a['samples']:,}", f"{a['accuracy']:.3f}", a["source"]]
         for a in doc["config"]["anchors"]])
    loads = [max(i["load_average_after"]) for i in doc["invocations"]]
    cmds = "; ".join(dict.fromkeys(f"`{i['command']}`" for i in doc["invocations"] if "combined" not in i))
    return out + (f"\n*From `benchmarks/results/continual_frontier.json` (preset `{doc['preset']}`; {len(doc['invocations'])} "
                  f"invocations, load average after them up to {max(loads):.1f}; {cmds}).*\n")


def _setting(settings) -> dict:
    """A tuning point's values: its preset overrides, or its settings (an MLP's width)."""
    return settings["overrides"] if "overrides" in settings else settings


@renderer("continual_frontier_tune", "continual_frontier_tune.json")
def render_continual_frontier_tune(doc) -> str:
    """The frontier's validation grids: per stream, budget and method, every point tried, the chosen one and
    whether it sits on an edge of the grid."""
    rows = []
    for st, by_budget in doc["streams"].items():
        for b, ms in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
            for m, e in ms.items():
                tried = "; ".join(f"{json.dumps(_setting(r['settings']), sort_keys=True)} → "
                                  + ("–" if r["accuracy"] is None else f"{r['accuracy']:.4f}") for r in e["results"])
                edge = e["on_edge"]
                rows.append([st, f"{mb(int(b))} MB", f"`{m}`", e["seed"], tried,
                             f"`{json.dumps(_setting(e['chosen']), sort_keys=True)}`"
                             if e["chosen"] else "none within the budget",
                             "inside" if not edge else "edge: " + ", ".join(edge) + "".join(
                                 f" ({k}: {why})" for k, why in e["edge_reasons"].items())])
    cmds = "; ".join(dict.fromkeys(f"`{i['command']}`" for i in doc["invocations"]))
    return table(["stream", "budget", "method", "seed", "validation accuracy of each point", "chosen", "grid"], rows) + f"\n*From `benchmarks/results/continual_frontier_tune.json` ({cmds}).*\n"


def _preset_value(stream: str, method: str, key: str):
    """The value a frontier run of ``method`` takes for setting ``key`` when no override sets it: its preset
    file's (``section.key``, ``policy.I.key``), or an order-free model's constructor default."""
    import inspect
    import tomllib

    from growmem import config, order_free
    from growmem.continual.methods import resolve

    m = resolve(method, stream)
    models = {"knn": order_free.KNN, "ncm": order_free.NCM, "slda": order_free.SLDA}
    if m.family in models:
        param = inspect.signature(models[m.family]).parameters.get(key)
        return None if param is None else param.default
    doc = tomllib.loads(config.resolve(m.preset).read_text())
    head, *rest = key.split(".")
    if head == "policy":
        return doc["policy"][int(rest[0])].get(rest[1])
    return doc.get(head, {}).get(rest[0])


def _run_setting(config: dict, key: str):
    """A baseline run's setting ``key`` as its recorded config says: the key itself, or for ``hidden_size``
    (recorded as a key since round 4) the width in its recorded model (``SimpleMLP(1 x 32, ...)``)."""
    if key == "hidden_size":
        plain = dict(config.items())          # either schema renders: the key, or else the model's width
        if key in plain:
            return plain[key]
        found = re.search(r"MLP\((?:\d+ x )?(\d+)", config["model"])
        if found is None:
            raise KeyError(f"hidden_size: neither recorded nor in the model {config['model']!r}")
        return int(found.group(1))
    return config[key]


@renderer("frontier_untuned", "continual_frontier.json", "continual_frontier_tune.json")
def render_frontier_untuned(doc, tune) -> str:
    """What the frontier still lacks: the preset's cells with fewer than 5 seeds, the validation grids with
    points not run (the tuning file's ``pending``), and the rows whose runs did not take the setting the
    validation grid now chooses at their stream and budget (a grid tuned or extended after they ran): what they
    ran with, what was chosen."""
    chosen = {(st, int(b), m): e["chosen"] for st, by_budget in tune["streams"].items()
              for b, ms in by_budget.items() for m, e in ms.items()}
    rows = {}
    for r in doc["runs"]:
        c = chosen.get((r["stream"], r["budget"], r["method"]))      # a plain dict: None where not tuned
        if not c:
            continue
        if "overrides" in c:
            want = dict(c["overrides"].items())
            over = dict(r["config"]["growmem"]["overrides"].items())   # each key optional: the preset's value
            ran = {k: over[k] if k in over else _preset_value(r["stream"], r["method"], k) for k in want}
        else:
            want = dict(c.items())
            ran = {k: _run_setting(r["config"], k) for k in want}
        if ran != want:
            key = (r["stream"], r["protocol"], r["method"], r["budget"])
            rows.setdefault(key, [json.dumps(ran, sort_keys=True), json.dumps(want, sort_keys=True), 0])[2] += 1
    out = "**Cells not measured yet** (a method of the preset with fewer than 5 seeds at a budget its stream ran)\n\n"
    missing = []
    for protocol, key in (("online", "methods"), ("offline", "offline_methods")):
        for st, wanted in doc["config"][key].items():
            runs = [r for r in doc["runs"] if (r["stream"], r["protocol"]) == (st, protocol)]
            for b in sorted({r["budget"] for r in runs}):
                short = [f"`{m}`" + (f" ({n})" if n else "") for m in wanted
                         for n in [len({r["seed"] for r in runs if (r["method"], r["budget"]) == (m, b)})] if n < 5]
                if short:
                    missing.append([f"{st}, {protocol}, {mb(b)} MB", ", ".join(short)])
    out += table(["stream, protocol, budget", "methods (seeds run)"], missing) if missing else "None.\n"
    out += ("\n**Validation grids not run through** (points of the benchmark's grid never run, or run only on "
            "another version of the method's preset; the method's runs there take its preset's or an earlier "
            "choice)\n\n")
    left = [[f"{p['stream']}, {p['protocol']}, {mb(p['budget'])} MB", f"`{p['method']}`",
             f"{p['never_run']} never run, {p['stale']} stale, of {p['of']}"] for p in tune["pending"]]
    out += table(["stream, protocol, budget", "method", "points left"], left) if left else \
        "None: every grid ran all its points.\n"
    out += ("\n**Rows run before their grid chose another setting** (tuned or extended after they ran; "
            "rerunning them is next)\n\n")
    if not rows:
        return out + "None: every row ran the setting its validation grid chooses.\n"
    return out + table(["stream, protocol, budget", "method", "its runs took", "the grid now chooses", "runs"],
                       [[f"{st}, {pr}, {mb(b)} MB", f"`{m}`", f"`{ran}`", f"`{want}`", n]
                        for (st, pr, m, b), (ran, want, n) in sorted(rows.items())])


@renderer("frontier_policies", "continual_frontier.json")
def render_frontier_policies(doc) -> str:
    """Per stream and budget (online): the growing readout with one more policy against the readout alone,
    paired by seed."""
    rows = []
    for st, by_budget in doc["policy_verdicts"].items():
        for b, vs in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
            for m, v in vs.items():
                g, o = doc["summary"][st][b][v["growmem"]], doc["summary"][st][b][v["other"]]
                rows.append([f"{st}, {doc['protocol']}, {mb(int(b))} MB", f"`{m}` {_mean_sd(g)}",
                             f"`{v['other']}` {_mean_sd(o)}", f"{v['difference']:+.4f}, {v['verdict']}"])
    return table(["stream, protocol, budget", "the readout with one more policy", "the readout alone",
                  "difference, paired t-test at 95 %"], rows)


@renderer("frontier_networks", "continual_frontier.json")
def render_frontier_networks(doc) -> str:
    """Per stream and budget: the best growing network (``net:*``) against the best online replay of raw
    images (``er_*:raw``), paired by seed."""
    rows = []
    for st, by_budget in doc["network_verdicts"].items():
        for b, v in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
            g, o = doc["summary"][st][b][v["growmem"]], doc["summary"][st][b][v["other"]]
            rows.append([f"{st}, {doc['protocol']}, {mb(int(b))} MB", f"`{v['growmem']}` {_mean_sd(g)}",
                         f"`{v['other']}` {_mean_sd(o)}", f"{v['difference']:+.4f}, {v['verdict']}"])
    return table(["stream, protocol, budget", "best growing network", "best online replay of 8-bit images",
                  "difference, paired t-test at 95 %"], rows)


@renderer("frontier_findings", "continual_frontier.json")
def render_frontier_findings(doc) -> str:
    """The README's frontier: per stream and budget, the best growmem method against the best other one, and
    how many of the preset's methods have run there (a cell still short of them says so)."""
    rows = []
    parts = [(doc["protocol"], doc["summary"], doc["verdicts"])] + \
        ([("offline", doc["offline"]["summary"], doc["offline"]["verdicts"])] if doc["offline"] else [])
    for protocol, summary, verdicts in parts:
        for st, by_budget in verdicts.items():
            for b, v in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
                g, o = summary[st][b][v["growmem"]], summary[st][b][v["other"]]
                said = {"better": "growmem higher", "worse": "growmem lower", "tie": "a tie",
                        "untested": "untested (one seed)"}[v["verdict"]]
                wanted = doc["config"]["methods" if protocol == "online" else "offline_methods"][st]
                ran = sum(m in summary[st][b] for m in wanted)
                rows.append([f"{st}, {protocol}, {mb(int(b))} MB", f"`{v['growmem']}` {_mean_sd(g)}",
                             f"`{v['other']}` {_mean_sd(o)}", f"{ran} of {len(wanted)}", said])
    return table(["stream, protocol, budget", "best growmem method", "best other method", "methods run",
                  "paired t-test at 95 %"], rows)


@renderer("block_drift", "block_drift.json")
def render_block_drift(doc) -> str:
    """Per growing network: its accuracy on the earlier experiences over its block's features now and over the
    features of their own time (the current readout both times), the features' move, the rows left."""
    cfg = doc["config"]
    rows = []
    for m, r in doc["summary"].items():
        d = r["stale_minus_now"]
        counts = lambda key: "–" if key not in r else " / ".join(f"{n:.0f}" for n in r[key])  # noqa: E731
        rows.append([f"`{m}`", f"{r['acc_now_old_mean']:.4f} ± {r['acc_now_old_std']:.4f}",
                     f"{r['acc_stale_old_mean']:.4f} ± {r['acc_stale_old_std']:.4f}",
                     f"{d['difference']:+.4f}, {d['verdict']}", f"{r['drift_old_mean']:.3f} ± {r['drift_old_std']:.3f}"]
                    + [counts(f"rows_{layer}_by_{what}") for layer in ("block_0", "readout")
                       for what in ("experience", "class_experience")])
    head = ["network", "earlier experiences now", "over the features of their time", "difference, paired t-test",
            "feature move", "block rows: appended in experience 1, 2, …", "block rows: of experience 1, 2, …'s classes",
            "readout rows: appended in", "readout rows: of the classes of"]
    seeds = ", ".join(map(str, cfg["seeds"]))
    return (f"\n{cfg['stream']}, {cfg['protocol']}, {mb(cfg['budget_bytes'])} MB, {cfg['split']} split, seeds {seeds} "
            f"(mean ± std over seeds; after the last experience)\n\n" + table(head, rows)
            + source("block_drift.json", doc))


@renderer("continual_ablation", "continual_ablation.json")
def render_continual_ablation(doc) -> str:
    out = ""
    for part, rows in doc["summary"].items():
        keys = ("acc_current", "prequential") if part.startswith("drifting") else ("accuracy",)
        first = next(iter(rows))
        head = (["variant"] + [f"{k} (mean ± std)" for k in keys] + [f"{k} vs `{first}`" for k in keys]
                + ["peak MB", "wall s"])
        body = [[v] + [f"{r[f'{k}_mean']:.4f} ± {r[f'{k}_std']:.4f}" for k in keys]
                + ["–" if v == first else r[f"{k}_vs_full"] for k in keys] + [mb(r["bytes_mean"]), f"{r['wall_s_mean']:.0f}"]
                for v, r in rows.items()]
        size = "" if part.startswith("drifting") else \
            f"; the first {doc['config']['split_options']['train_limit']:,} training images"
        out += f"\n**{part}** (seeds {', '.join(map(str, doc['config']['seeds']))}, paired{size})\n\n" + table(head, body)
    return out + source("continual_ablation.json", doc)


@renderer("continual_tune", "continual_tune.json")
def render_continual_tune(doc) -> str:
    rows = []
    for st, ms in doc["streams"].items():
        for m, e in ms.items():
            best = max((r["accuracy"] for r in e["results"]), default=None)
            chosen = e["chosen"]
            rows.append([st, f"`{m}`", len(e["results"]),
                         f"`{json.dumps(chosen, sort_keys=True)}`" if chosen else "its recipe",
                         "–" if best is None else f"{best:.4f}"])
    cmds = "; ".join(f"`{i['command']}`" for i in doc["invocations"])
    return table(["stream", "method", "grid points", "chosen", "best validation accuracy"], rows) + \
        f"\n*From `benchmarks/results/continual_tune.json` (validation split, seed {doc['seed']}; {cmds}).*\n"


# ---- single pass and growth ---------------------------------------------------------------------

@renderer("single_pass", "single_pass.json")
def render_single_pass(doc) -> str:
    s = doc["summary"]
    rows = [[f"`{r['label']}`", f"{r['wall_s']:.1f}", f"{r['ms_per_step']:.1f}", pct(r["accuracy"]),
             " / ".join(str(n) for n in r["rows"].values())] for r in doc["runs"]]
    out = table(["run", "wall (s)", "ms/step", "test accuracy", "rows per layer"], rows)
    out += (f"\nThe fp32 `weighted_softmax` pass: {s['wall_s']:.1f} s, {times(s['ratio_to_floor'])} the byte floor "
            f"({s['floor_s']:.1f} s at the {s['read_bandwidth_gb_per_s']:.1f} GB/s read bandwidth measured in the "
            f"same process), {times(s['ratio_to_roofline'])} the roofline (compute floor {s['compute_floor_s']:.1f} s "
            f"at {s['matmul_gflops_per_s']:.0f} GFLOP/s); {s['cores_used']:.2f} cores used, system time "
            f"{pct(s['sys_fraction'])}, {s['minor_faults_per_step']:.1f} minor page faults per step; "
            f"{times(s['speedup_vs_reference'])} faster than the {s['reference_wall_s_reported']:.0f} s reported for "
            f"the reference implementation (measured on another machine). Prediction with the full memories: "
            f"{s['predict']['images_per_s']:.0f} test images/s.\n\n"
            f"Capped memory ({s['capped']['cap']} rows per layer): {s['capped']['ms_per_step']:.1f} ms/step at the "
            f"cap against {s['capped']['uncapped_ms_per_step_same_rows']:.1f} for an unbounded memory of the same "
            f"rows ({times(s['capped']['ratio'])}). Hybrid: {s['hybrid']['ms_per_step']:.0f} ms/step, "
            f"{times(s['hybrid']['speedup_vs_reference_low'])} faster per step than the lower end of the "
            f"reference's reported step time.\n\nThe runs were merged from these invocations:\n\n")
    out += "".join(f"- `{inv['command']}` (runs {', '.join(inv['runs'])}; load {inv['load_average_before']:.1f} "
                   f"before)\n" for inv in doc["invocations"])
    return out + source("single_pass.json", doc, command=False)


def _hybrid_growth(doc, path) -> str:
    s, cfg = doc["summary"], doc["config"]
    rows = [[cfg["n_train"], "full growth (Alg. 3)", "1.000", pct(s["full_growth_accuracy"])]]
    rows += [[cfg["n_train"], f"hybrid τ = {p['tau']:.2f}√d", f"{p['capacity_fraction']:.3f}", pct(p["accuracy"])]
             for p in s["points"]]
    out = table(["samples", "model", "capacity fraction", "test accuracy"], rows)
    out += f"\nTest images: {cfg['n_test']}. Goal met: {'yes' if s['goal_met'] else 'no'}.\n"
    return out + source(path, doc)


@renderer("hybrid_growth", "hybrid_growth.json")
def render_hybrid_growth(doc) -> str:
    return _hybrid_growth(doc, "hybrid_growth.json")


@renderer("hybrid_growth_8k", "hybrid_growth_8k/hybrid_growth.json")
def render_hybrid_growth_8k(doc) -> str:
    return _hybrid_growth(doc, "hybrid_growth_8k/hybrid_growth.json")


@renderer("decay_bounded", "decay_bounded.json")
def render_decay_bounded(doc) -> str:
    s = doc["summary"]
    rows = [[g, s["rows_at_end_by_gamma"][g], pct(a)] for g, a in s["accuracy_by_gamma"].items()]
    out = table(["γ", "rows at the end", "test accuracy"], rows)
    out += (f"\n{s['samples']} samples streamed; at γ = {s['gamma']} (pruned below {s['prune_below']}) the memory "
            f"holds {s['rows_at_half']} rows half-way and {s['rows_at_end']} at the end.\n")
    return out + source("decay_bounded.json", doc)


@renderer("novelty_search", "novelty_search.json")
def render_novelty_search(doc) -> str:
    s = doc["summary"]
    out = table(["chunk rows", "bare product / novelty search"],
                [[c + (" (default)" if int(c) == s["default_chunk"] else ""), f"{r:.2f}"]
                 for c, r in s["ratio_by_chunk"].items()])
    out += (f"\nB = {s['shapes']['B']}, d = {s['shapes']['d']}, N = {s['shapes']['N']}: at the default chunk the "
            f"search takes {s['novelty_search_ms']:.1f} ms against {s['bare_product_ms']:.1f} ms for the bare "
            f"product (ratio {s['ratio']:.2f}).\n")
    return out + source("novelty_search.json", doc)


# ---- kernels ------------------------------------------------------------------------------------

@renderer("indexed", "indexed.json")
def render_indexed(doc) -> str:
    s = doc["summary"]
    rows = []
    for mode, by in s["by_mode_and_nprobe"].items():
        for p, x in by.items():
            worst = max(e["rel_error_y"] for e in x["errors_by_temperature"].values())
            rows.append([mode.replace("_", " "), p, times(x["speedup"]), f"{x['recall_at_10']:.3f}", f"{worst:.1e}"])
    out = table(["probe", "nprobe", "speed-up over the exact step", "recall@10", "largest relative error of y"],
                rows)
    temps = ", ".join(str(t) for t in doc["config"]["temperatures"])
    load = ", ".join(f"{a:.1f}" for a in (s["load_average_before"][0], s["load_average_after"][0]))
    out += (f"\nN = {s['n']:,} rows in {s['n_lists']:,} lists, d = {doc['config']['d']}, B = {doc['config']['batch']}: "
            f"the exact step (forward and ∂/∂q) takes {s['exact_ms']:.0f} ms; the error is the largest over "
            f"T = {temps}; load average {load} (before, after).\n")
    return out + source("indexed.json", doc, command=False)


@renderer("retrieval", "retrieval.json")
def render_retrieval(doc) -> str:
    s = doc["summary"]
    rows = [[r["B"], r["d"], r["N"], f"{r['ratio_weighted_softmax']:.2f}", f"{r['ratio_rbf']:.2f}"]
            for r in doc["retrieval"]]
    out = table(["B", "d", "N", "weighted_softmax", "rbf"], rows)
    lo, hi = s["goal_exponent"]
    out += (f"\nRatio = bare products' time / kernel time. Worst at B ≥ 64: "
            f"{s['min_ratio_batch_ge_64_weighted_softmax']:.2f} (weighted softmax), "
            f"{s['min_ratio_batch_ge_64_rbf']:.2f} (RBF); goal {s['goal_ratio']}. "
            f"Train-step time grows as N^{s['step_time_exponent']:.2f} over N = "
            f"{', '.join(map(str, doc['train_step']['sizes']))} rows (goal {lo}–{hi}).\n")
    return out + source("retrieval.json", doc, command=False)


# ---- storage ------------------------------------------------------------------------------------

@renderer("spill", "spill.json")
def render_spill(doc) -> str:
    s, cfg = doc["summary"], doc["config"]
    out = table(["quantity", "value"], [
        ["cold-tier retrieval / raw sequential read",
         f"{s['read_bandwidth_fraction']:.3f} (goal {s['goal_fraction']})"],
        ["retrieval read rate", f"{s['achieved_gb_per_s']:.2f} GiB/s"],
        ["raw read of the same files (buffered / O_DIRECT)",
         f"{s['raw_read_gb_per_s']:.2f} / {s['raw_direct_read_gb_per_s']:.2f} GiB/s"],
        ["retrieval / O_DIRECT read", f"{s['fraction_of_direct_read']:.3f}"],
        ["the same retrieval through TensorStore", f"{s['tensorstore_reads_fraction']:.3f} "
                                                   f"(local reads {times(s['local_reads_speedup'])} faster)"],
        ["in-RAM retrieval of the same rows", f"{s['in_ram_rows_per_s']:.0f} rows/s (tier {s['tier_rows_per_s']:.0f})"],
        ["peak RSS (build / reads)", f"{s['peak_rss_build_gb']:.2f} / {s['peak_rss_reads_gb']:.2f} GiB "
                                     f"for a {s['ram_budget_gb']:.1f} GiB budget"],
    ])
    out += (f"\n{cfg['rows']} rows × d = {cfg['d_in']}, {s['cold_gb']:.2f} GiB cold, {s['queries']} queries, page "
            f"cache {'dropped' if s['page_cache_dropped'] else 'not dropped'}.\n")
    return out + source("spill.json", doc, command=False)


@renderer("spill_training", "spill_training.json")
def render_spill_training(doc) -> str:
    s = doc["summary"]
    out = table(["quantity", "value"], [
        ["spilling step / all-in-RAM step (final window)", times(s["step_time_ratio"])],
        ["forward + backward alone (chunks from the tier / from RAM)",
         f"{times(s['fwd_bwd_ratio'])} / {times(s['fwd_bwd_ratio_cached_chunks'])}"],
        ["step time (RAM / spilling)", f"{1e3 * s['ram_step_s']:.1f} / {1e3 * s['spill_step_s']:.1f} ms"],
        ["RAM budget / final rows / cold", f"{1024 * s['ram_budget_gb']:.0f} / {1024 * s['final_rows_gb']:.0f} / "
                                           f"{1024 * s['cold_gb']:.0f} MiB"],
        ["peak RSS (spilling / all in RAM)", f"{s['peak_rss_gb_spill']:.2f} / {s['peak_rss_gb_ram']:.2f} GiB"],
        ["largest prediction difference", f"{s['max_pred_diff']:.1e} (outputs up to {s['max_abs_pred']:.1f})"],
    ])
    return out + source("spill_training.json", doc)


@renderer("checkpoint", "checkpoint.json")
def render_checkpoint(doc) -> str:
    rows = [[r["rows"], mb(r["bytes"]), times(r["save_ratio_vs_numpy"]), times(r["restore_ratio_vs_numpy"])]
            for r in doc["sizes"]]
    out = table(["rows", "MB", "save / numpy", "restore / numpy"], rows)
    s = doc["summary"]
    out += (f"\nAt {s['at_rows']} rows: save {s['save_mb_per_s']:.0f} MiB/s, restore {s['restore_mb_per_s']:.0f} "
            f"MiB/s.\n")
    return out + source("checkpoint.json", doc, command=False)


@renderer("sharded", "sharded.json")
def render_sharded(doc) -> str:
    cfg = doc["config"]
    rows = [[r["devices"], times(r["ratio_vs_unsharded"]), times(r["ratio_vs_one_device"]), f"{r['max_abs_err']:.1e}"]
            for r in doc["runs"]]
    out = table(["devices", "time / unsharded kernel", "time / one device", "largest difference"], rows)
    out += (f"\n{cfg['rows']} rows, d = {cfg['d_in']} → {cfg['d_out']}, {cfg['queries']} queries, forced host "
            f"devices on {doc['summary']['cpu_count']} cores (no speed-up is possible there).\n")
    return out + source("sharded.json", doc, command=False)


# ---- teacher-student and reproductions ----------------------------------------------------------

def _teacher_student(doc, path) -> str:
    s = doc["summary"]
    var = s["target_variance"]
    rows = [[m.replace("_", " "), ", ".join(f"{k} = {v}" for k, v in s["chosen_hyperparameters"][m].items()),
             f"{loss:.2e}", f"{loss / var:.3f}"] for m, loss in s["final_test_loss"].items()]
    out = table(["model", "best configuration", "test MSE", "/ target variance"], rows)
    out += (f"\n{s['samples']} samples. Growing below the parametric softmax: "
            f"{'yes' if s['claim_gws_below_parametric'] else 'no'}; reference MLP lowest: "
            f"{'yes' if s['claim_mlp_best'] else 'no'}.\n")
    return out + source(path, doc)


@renderer("teacher_student", "teacher_student.json")
def render_teacher_student(doc) -> str:
    return _teacher_student(doc, "teacher_student.json")


@renderer("teacher_student_sweep1", "teacher_student_sweep1.json")
def render_teacher_student_sweep1(doc) -> str:
    return _teacher_student(doc, "teacher_student_sweep1.json")


@renderer("repro", "repro")
def render_repro(folder: Path) -> str:
    """The ``growmem repro --table`` table (claim | paper | measured | command), from the JSONs in ``folder``."""
    from growmem.repro import table as repro_table
    text = repro_table.render(folder)
    if "Not run here" in text:
        raise RenderError(f"{folder}: some experiments have no JSON: {text.splitlines()[-1]}")
    return text


# ---- the README's headline table ----------------------------------------------------------------

@renderer("headline", "continual.json", "repro/single-pass.json", "single_pass.json",
          "repro/hybrid-capacity.json", "spill.json")
def render_headline(continual, repro_single, single, hybrid, spill) -> str:
    rows = []
    for st, s in continual["summary"].items():
        ours = _growmem_methods(s)
        others = [m for m in s if m not in ours and s[m]["within_budget"] is not False]
        if not ours or not others:
            continue
        top = max(ours, key=lambda m: s[m]["accuracy_mean"])
        rival = max(others, key=lambda m: s[m]["accuracy_mean"])
        knn = [m for m in s if m.startswith("knn:")]
        planned = continual["config"]["methods"][st]
        ran = f" ({len([m for m in planned if m in s])} of {len(planned)} methods run)" \
            if any(m not in s for m in planned) else ""
        rows.append([f"{st}: final accuracy within {mb(continual['config']['budget_bytes'])} MB{ran}",
                     f"`{top}` **{_acc(s[top])}**",
                     f"best other method within the budget `{rival}` {_acc(s[rival])}"
                     + (f"; `{knn[0]}` {_acc(s[knn[0]])}" if knn and knn[0] != rival else ""), "`continual.json`"])
    rs = repro_single["summary"]
    acc = lambda m: rs["metrics"][f"accuracy/{m}"]
    pm = lambda m: f"{pct(acc(m)['mean'])} ± {100 * acc(m)['std']:.2f}"
    claim = rs["claims"]["growing_beats_mlps"]
    rows.append([f"one pass over {rs['samples']:,} {rs['dataset'].upper()} images (B = 16, L = 2), "
                 f"{len(rs['seeds'])} seeds: test accuracy",
                 ", ".join(f"{m} **{pm(m)}**" for m in ("weighted_softmax", "gauge", "rbf")),
                 f"best MLP `{rs['best_mlp']}` {pm(rs['best_mlp'])}; kernel ridge {pm('kernel_ridge')}; "
                 f"\"{claim['claim']}\": {claim['verdict']}", "`repro/single-pass.json`"])
    sp = single["summary"]
    rows.append(["one pass over all of MNIST (weighted softmax, fp32) on the CPU: wall time", f"**{sp['wall_s']:.0f} s**, "
                 f"{times(sp['ratio_to_roofline'])} the roofline", f"{sp['reference_wall_s_reported']:.0f} s reported "
                 "for the reference implementation (another machine)", "`single_pass.json`"])
    h = hybrid["summary"]
    best = h["goal"]["best"]
    rows.append([f"hybrid growth (Alg. 4) on {h['dataset']}: capacity, accuracy",
                 f"**{pct(best['capacity_fraction'])}** of full growth → {pct(best['accuracy'])}",
                 f"full growth {pct(h['full_growth_accuracy'])}", "`repro/hybrid-capacity.json`"])
    s = spill["summary"]
    rows.append(["retrieval from a cold tier on disk, share of the raw read bandwidth",
                 f"**{s['read_bandwidth_fraction']:.2f}**",
                 f"through TensorStore {s['tensorstore_reads_fraction']:.2f}",
                 "`spill.json`"])
    return table(["result", "growmem", "against", "from `benchmarks/results/`"], rows)


# ---- examples (real code, for the README) -------------------------------------------------------

def example_code(name: str) -> str:
    """``examples/NAME.py`` without its module docstring, as a fenced block."""
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        raise RenderError(f"no example {path.relative_to(ROOT)}")
    text = path.read_text()
    tree = ast.parse(text)
    body = text.splitlines()
    doc = ast.get_docstring(tree, clean=False)
    start = tree.body[0].end_lineno if doc is not None else 0
    code = "\n".join(body[start:]).strip("\n")
    return f"```python\n{code}\n```\n"


# ---- README blocks and the MkDocs hook ----------------------------------------------------------

def block(kind: str, name: str) -> str:
    return render(name) if kind == "results" else example_code(name)


def readme_text(text: str) -> str:
    """``text`` with every generated block replaced by what it renders to now."""
    return BLOCK.sub(lambda m: m.group(1) + block(m.group(2), m.group(3)) + m.group(5), text)


def readme_blocks(text: str):
    """``[(kind, name, body)]`` of the generated blocks in ``text``."""
    return [(m.group(2), m.group(3), m.group(4)) for m in BLOCK.finditer(text)]


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs hook: ``<!-- results:NAME -->`` lines become NAME's rendered markdown."""
    return PLACEHOLDER.sub(lambda m: render(m.group(1)), markdown)


_ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc|obj):(?=<code>)")


def on_page_content(html: str, page, config, files) -> str:
    """MkDocs hook: the docstrings' Sphinx roles (``:func:`x```) read as plain code ``x``."""
    return _ROLE.sub("", html)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name", nargs="?", help="print one renderer's markdown")
    p.add_argument("--readme", action="store_true", help="rewrite README.md's generated blocks")
    p.add_argument("--check", action="store_true", help="exit 1 if README.md's generated blocks are stale")
    p.add_argument("--list", action="store_true", help="the registered renderers and their files")
    a = p.parse_args(argv)
    if a.list:
        for r in RENDERERS.values():
            print(f"{r.name:24s} {', '.join(r.files)}")
    elif a.name:
        sys.stdout.write(render(a.name))
    elif a.readme or a.check:
        old = README.read_text()
        new = readme_text(old)
        if a.check:
            if new != old:
                print("README.md's generated blocks are stale: run python docs/render.py --readme", file=sys.stderr)
                return 1
        elif new != old:
            tmp = README.with_suffix(".md.partial")
            tmp.write_text(new)
            tmp.replace(README)
            print("README.md: generated blocks rewritten")
    else:
        p.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
