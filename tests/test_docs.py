"""The documentation: the site builds with warnings as errors, the README stays short and its
generated blocks current, every measured number comes from a committed JSON through a renderer
that fails loudly on a schema change, and the prose carries no hand-typed measurements."""
import copy
import importlib.util
import json
import os
import re

import numpy as np
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_spec = importlib.util.spec_from_file_location("growmem_docs_render", DOCS / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def _pages():
    return sorted(p for p in DOCS.rglob("*.md"))


# ---- the site -----------------------------------------------------------------------------------

def test_site_builds_with_warnings_as_errors(tmp_path):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the docs extra is not installed: pip install -e '.[docs]'")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(site)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    html = {p: p.read_text() for p in site.rglob("*.html")}
    assert not [p for p, t in html.items() if "<!-- results:" in t], "a placeholder was left unrendered"
    # the hook rendered the JSONs: the continual page shows growmem's accuracy from continual.json
    acc = json.loads((render.RESULTS / "continual.json").read_text())["summary"]["split_mnist"]["target:dct"]["accuracy_mean"]
    assert f"{acc:.4f}" in html[site / "results" / "continual" / "index.html"]
    # the snippets included the example files, the API reference was generated from the docstrings
    assert "TeacherStudent" in html[site / "getting-started" / "index.html"]
    assert 'id="growmem.kernels.reduce"' in html[site / "reference" / "core" / "index.html"]
    assert not [p for p, t in html.items() if re.search(r":(func|class|mod|meth):<code>", t)]


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = set(re.findall(r"([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {str(p.relative_to(DOCS)) for p in _pages()}
    assert nav == pages


# ---- the README ---------------------------------------------------------------------------------

def test_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_readme_starts_with_the_setup_commands_then_the_main_job():
    code = [ln.split("#")[0].strip() for ln in README.read_text().splitlines()
            if ln.startswith((".venv/", "python3 "))]
    assert code[:3] == ["python3 -m venv .venv && .venv/bin/pip install -e '.[all]'",
                        ".venv/bin/python -m pytest -q", ".venv/bin/growmem continual"]


def test_readme_generated_blocks_are_current():
    text = README.read_text()
    blocks = render.readme_blocks(text)
    assert {(k, n) for k, n, _ in blocks} >= {("results", "headline"), ("example", "quickstart")}
    assert all(body.strip() for _, _, body in blocks)
    assert render.readme_text(text) == text, "stale: run python docs/render.py --readme"


def test_a_stale_readme_block_is_rewritten():
    text = README.read_text()
    stale = re.sub(r"(<!-- begin:results:headline -->\n).*?(<!-- end:results:headline -->)",
                   r"\1| old | table |\n\2", text, flags=re.S)
    assert stale != text
    assert render.readme_text(stale) == text


def test_readme_headline_shows_the_committed_numbers():
    """An independent reading of the JSONs: the numbers the headline table must show."""
    text = README.read_text()
    cont = json.loads((render.RESULTS / "continual.json").read_text())
    for stream, rows in cont["summary"].items():   # growmem's best method (a target memory or a network)
        ours = {m: r for m, r in rows.items() if m.split(":")[0] in ("target", "net")}
        top = max(ours, key=lambda m: ours[m]["accuracy_mean"])
        r = ours[top]
        assert f"`{top}` **{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} ({r['seeds']} seeds)**" in text, stream
    sp = json.loads((render.RESULTS / "repro" / "single-pass.json").read_text())["summary"]
    for method in ("weighted_softmax", "gauge", "rbf"):       # mean ± sample std over the seeds
        values = sp["metrics"][f"accuracy/{method}"]["values"]
        assert len(values) == len(sp["seeds"]) >= 3
        assert f"{method} **{100 * np.mean(values):.2f} % ± {100 * np.std(values, ddof=1):.2f}**" in text
    assert f": {sp['claims']['growing_beats_mlps']['verdict']} |" in text


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


# ---- the renderers ------------------------------------------------------------------------------

def test_every_placeholder_names_a_renderer_and_every_renderer_is_shown():
    used = set(re.findall(r"<!-- results:([a-z0-9_]+) -->", "".join(p.read_text() for p in _pages())))
    used |= {n for k, n, _ in render.readme_blocks(README.read_text()) if k == "results"}
    assert used == set(render.RENDERERS)


@pytest.mark.parametrize("name", sorted(render.RENDERERS))
def test_renderer_runs_on_its_committed_files(name):
    out = render.render(name)
    assert re.search(r"^\|.*\d.*\|$", out, re.M), f"{name} rendered no table of numbers:\n{out}"


class _Reads:
    """Wraps a loaded JSON and records every scalar a renderer reads by key (``doc[k]``, ``.get``)."""

    def __init__(self):
        self.paths = set()

    def wrap(self, value, path):
        if isinstance(value, dict):
            return _Dict(value, path, self)
        if isinstance(value, list):
            return _List(value, path, self)
        return value


class _Dict(dict):
    def __init__(self, data, path, reads):
        super().__init__(data)
        self._path, self._reads = path, reads

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if not isinstance(value, (dict, list)):
            self._reads.paths.add(self._path + (key,))
        return self._reads.wrap(value, self._path + (key,))

    def get(self, key, default=None):
        self._reads.paths.add(self._path + (key,))      # a default would hide a missing key: recorded
        return self[key] if key in self else default

    def items(self):
        return [(k, self._reads.wrap(v, self._path + (k,))) for k, v in super().items()]

    def values(self):
        return [v for _, v in self.items()]


class _List(list):
    def __init__(self, data, path, reads):
        super().__init__(data)
        self._path, self._reads = path, reads

    def __getitem__(self, i):
        return self._reads.wrap(super().__getitem__(i), self._path + (i,))

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _without(doc, path):
    """``doc`` without the key at ``path``: the containers on the path copied (the rest shared, never
    changed), so a large results file is not deep-copied once per key; None when the key is a list's."""
    root = copy.copy(doc)
    parent = root
    for key in path[:-1]:
        child = copy.copy(parent[key])
        parent[key] = child
        parent = child
    if not isinstance(parent, dict):
        return None
    del parent[path[-1]]
    return root


@pytest.mark.parametrize("name", sorted(n for n, r in render.RENDERERS.items()
                                        if all(p.suffix == ".json" for p in r.paths())))
def test_renderer_fails_loudly_on_every_missing_key(name):
    """Delete, one at a time, each key the renderer read: each deletion must raise RenderError
    (an older or newer schema never renders a silently shorter block). The elements of a list share a
    schema (a results file's runs): a key is deleted from the first element it was read in, not from all
    of them (hundreds of runs made this one test take minutes)."""
    docs = [render.load(p) for p in render.RENDERERS[name].paths()]
    reads = _Reads()
    render.render(name, [reads.wrap(d, (i,)) for i, d in enumerate(docs)])
    assert reads.paths, f"{name} read no key"
    first = {}
    for path in sorted(reads.paths, key=str):     # the position in the schema: list indices are wildcards
        first.setdefault(path[:1] + tuple("[]" if isinstance(k, int) else k for k in path[1:]), path)
    for path in first.values():
        i, rest = path[0], path[1:]
        broken = _without(docs[i], rest)
        if broken is None:
            continue
        with pytest.raises(render.RenderError, match="missing or changed key"):
            render.render(name, docs[:i] + [broken] + docs[i + 1:])


def test_a_missing_results_file_is_named():
    with pytest.raises(render.RenderError, match="does not exist"):
        render.load(render.RESULTS / "no_such_benchmark.json")
    with pytest.raises(render.RenderError, match="no renderer"):
        render.render("no_such_renderer")


# ---- no hand-typed measurements in the prose ----------------------------------------------------

NUM = r"(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?"
MEASURED = {
    "percentage": NUM + r"\s?%",
    "ratio": NUM + r"\s?[×x](?![\s\d.,]*\d)(?!\w)",
    "times faster": NUM + r"\s?times\s+(?:faster|slower)",
    "duration": NUM + r"\s?(?:ns|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?)(?![\w/])",
    "throughput": NUM + r"\s?(?:[kKMGT]i?B|GFLOP|FLOP|rows|images|samples|steps|queries)/s\b",
    "per-step time": NUM + r"\s?(?:ms|s)/step\b",
    "four decimals": r"(?<![\w.])\d+\.\d{4,}\b",
    "mantissa and exponent": r"(?<![\w.])\d\.\d+e[-+]?\d+\b",
    "fitted exponent": r"\^\s?\d+\.\d+",
}


def prose(text: str) -> str:
    """``text`` without its generated blocks, placeholders, HTML comments, snippet lines and inline
    code; of a fenced code block only the comments (``# ...``) stay, since they are prose too."""
    text = render.BLOCK.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            line = line.split(" #", 1)[1] if " #" in line else (line if line.lstrip().startswith("#") else "")
        out.append(line)
    return re.sub(r"`[^`\n]*`", "", "\n".join(out))


def measured_numbers(text: str):
    """``[(kind, match)]``: the measured-looking numbers in ``text``'s prose."""
    return [(kind, m.group(0)) for kind, pat in MEASURED.items() for m in re.finditer(pat, prose(text))]


def test_the_lint_flags_measured_numbers():
    samples = {
        "the pass took 381.4 s on two cores": "duration",
        "(~1 min on 2 cores)": "duration",
        "one step at 101.7 ms/step": "per-step time",
        "test accuracy 98.25 %, the reference 98.10%": "percentage",
        "a save takes 1.37× the time": "ratio",
        "it is 3.6x faster": "ratio",
        "runs 4 times faster than before": "times faster",
        "reads at 0.71 GB/s": "throughput",
        "292 images/s with the full memories": "throughput",
        "reaches 0.9834 on Split-MNIST": "four decimals",
        "a test MSE of 5.16e-4": "mantissa and exponent",
        "step time grows as N^1.02": "fitted exponent",
        "```bash\ngrowmem repro x --preset cpu   # ~25 min here\n```": "duration",
    }
    for text, kind in samples.items():
        assert kind in {k for k, _ in measured_numbers(text)}, text


def test_the_lint_passes_hyperparameters_defaults_and_code():
    fine = ["the weighted_softmax preset: L=2, T = 6, η = 0.003, β = 3, B = 16",
            "weight decay γ = 0.003 per step, rows pruned below 1e-3, Adam 1e-3",
            "SimpleMLP (2 × 400, no dropout), 5 × 2 classes, B × tokens rows, n × n coefficients",
            "a budget of `--memory-budget 15.7MB`, chunks of 32 MiB, 1 MB = 10^6 B, Eq. 23/91, App. F.4",
            "`growmem train --steps 300` then `python x.py  # 1.5 s`",
            "<!-- begin:results:x -->\n| 98.25 % | 381.4 s |\n<!-- end:results:x -->",
            "```python\ny = f(q, temperature=0.002)   # Eq. 8\n```"]
    for text in fine:
        assert measured_numbers(text) == [], text


@pytest.mark.parametrize("path", [README] + _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_prose_has_no_hand_typed_measurements(path):
    found = measured_numbers(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: render these from a JSON (docs/render.py) or drop them: {found}"


def test_the_frontier_lists_rows_that_ran_another_setting_than_their_grid_chooses():
    """A run without an override took its preset's value: listed only where the grid chose another one; a
    cell short of 5 seeds is listed with the seeds it has; a grid with points left, with their counts."""
    import tomllib

    from growmem import config

    dim = tomllib.loads(config.resolve("target_proj_merge").read_text())["keys"]["dim"]

    def run(budget, seed, overrides):
        return {"stream": "permuted_mnist", "protocol": "online", "method": "target:proj_merge", "budget": budget,
                "seed": seed, "config": {"growmem": {"overrides": overrides}}}

    doc = {"config": {"methods": {"permuted_mnist": ["target:proj_merge"]}, "offline_methods": {}},
           "runs": [run(1, s, {}) for s in range(5)] + [run(2, s, {}) for s in range(5)]
           + [run(3, s, {"keys.dim": 2 * dim}) for s in range(3)]}
    tune = {"streams": {"permuted_mnist": {str(b): {"target:proj_merge": {"chosen": {"overrides": {"keys.dim": d}}}}
                                           for b, d in ((1, dim), (2, 2 * dim), (3, 2 * dim))}},
            "pending": [{"stream": "permuted_mnist", "budget": 300_000, "protocol": "online", "method": "knn:proj",
                         "never_run": 2, "stale": 1, "of": 4}]}
    text = render.render_frontier_untuned(doc, tune)
    assert "| permuted_mnist, online, 0.30 MB | `knn:proj` | 2 never run, 1 stale, of 4 |" in text
    assert "every grid ran all its points" in render.render_frontier_untuned(doc, {**tune, "pending": []})
    # a baseline's width: recorded as hidden_size, or (runs before it was) in the recorded model
    er = lambda seed, config: {"stream": "split_mnist", "protocol": "online", "method": "er_reservoir:raw",
                               "budget": 1, "seed": seed, "config": config}
    doc["runs"] = [er(1, {"model": "SimpleMLP(1 x 32, drop_rate=0.0)"}), er(2, {"model": "x", "hidden_size": 16}),
                   er(3, {"model": "SimpleMLP(1 x 16, drop_rate=0.0)"})]
    tune["streams"] = {"split_mnist": {"1": {"er_reservoir:raw": {"chosen": {"hidden_size": 16}}}}}
    listed = [ln for ln in render.render_frontier_untuned(doc, tune).splitlines() if "er_reservoir:raw" in ln]
    assert len(listed) == 1 and '`{"hidden_size": 32}`' in listed[0] and listed[0].endswith("| 1 |")
    assert "| permuted_mnist, online, 0.00 MB | `target:proj_merge` (3) |" in text          # budget 3: 3 seeds
    listed = [ln for ln in text.splitlines() if f'`{{"keys.dim": {2 * dim}}}`' in ln]
    assert len(listed) == 1 and f'`{{"keys.dim": {dim}}}`' in listed[0] and listed[0].endswith("| 5 |")
