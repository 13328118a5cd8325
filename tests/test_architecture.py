"""The layering of the package: no import cycles (function-local imports included), and kernel
differences live only in the kernel table."""
import ast
import re
from pathlib import Path

import growmem

ROOT = Path(growmem.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


#: compiled extension modules (built from csrc/; they import nothing of growmem)
EXTENSIONS = ("growmem._native",)


def _modules():
    out = {}
    for p in ROOT.rglob("*.py"):
        if "presets" in p.relative_to(ROOT).parts:
            continue
        out[_module_name(p)] = p
    return out


def _known(mods) -> set:
    """The names an import may resolve to: the source modules and the compiled extensions."""
    return set(mods) | set(EXTENSIONS)


def _imports(name: str, path: Path, known) -> set:
    """Every growmem module ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name` the module
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            targets = subs if len(subs) == len(node.names) else [mod] + subs
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def test_no_module_imports_a_module_that_imports_it_back():
    mods = _modules()
    graph = {**{e: set() for e in EXTENSIONS}, **{m: _imports(m, p, _known(mods)) for m, p in mods.items()}}
    # a package's __init__ is run by importing any of its submodules: an edge sub -> package is not
    # an import "back" unless the package imports the submodule
    cycles = []
    index, low, stack, on, counter = {}, {}, [], set(), [0]

    def strong(v):   # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles: {cycles}"


#: the floors of the package (docs/architecture): a module may import growmem modules of lower floors
#: only, and modules of its own package (``continual.*`` among themselves). The longest prefix decides.
FLOORS = {
    "_native": -1,   # the compiled extension (csrc/), under everything
    "errors": 0, "version": 0, "environment": 0.5, "native": 0.75,   # native reads environment's variables
    "units": 0.25,   # the one rule of each user-given quantity (units: errors)
    "kernels": 1, "rules": 1, "memory": 1, "keyspaces": 1, "locks": 1, "optim": 1,
    "classical": 1, "reporting": 1, "runtime": 1, "data": 1, "reservoir": 1, "learner": 1,
    "backends": 2, "nadaraya": 2, "index": 2,
    "backends.sharded": 3, "backends.tiered": 3, "backends.indexed": 3, "policies": 3, "order_free": 3,
    "layers": 4, "train": 4,
    "": 5, "store": 5, "config": 5, "data.teacher_student": 5,   # "": the package itself (growmem/__init__)
    "checkpoint": 6,
    "continual": 7, "repro": 7,
    "app": 8,   # the command line (growmem.app): the library never imports it
}


def _floor(module: str):
    rel = module[len("growmem."):] if module.startswith("growmem.") else ""
    best = max((p for p in FLOORS if p == "" or rel == p or rel.startswith(p + ".")), key=len)
    return best, FLOORS[best]


def floor_violations(graph):
    """``(importer, imported)`` pairs that break :data:`FLOORS`."""
    bad = []
    for m, targets in graph.items():
        unit, level = _floor(m)
        for t in targets:
            t_unit, t_level = _floor(t)
            same_package = unit != "" and t_unit.split(".")[0] == unit.split(".")[0] and t_level == level
            if t_level >= level and not same_package and t_unit != unit:
                bad.append((m, t))
    return sorted(bad)


def test_every_module_imports_only_from_the_floors_below_it():
    mods = _modules()
    graph = {**{e: set() for e in EXTENSIONS}, **{m: _imports(m, p, _known(mods)) for m, p in mods.items()}}
    unplaced = [m for m in mods if _floor(m)[0] == "" and m != "growmem"]
    assert not unplaced, f"modules with no floor in FLOORS: {unplaced}"
    assert not floor_violations(graph), floor_violations(graph)
    # the check itself: the bottom floor importing the trainer, or a backend importing the layers, is caught
    assert floor_violations({"growmem.memory": {"growmem.train"}}) == [("growmem.memory", "growmem.train")]
    assert floor_violations({"growmem.backends.tiered": {"growmem.layers"}}) != []
    assert floor_violations({"growmem.continual.runner": {"growmem.continual.fast"}}) == []
    assert floor_violations({"growmem.continual.runner": {"growmem.app.options"}}) != []   # the library, not the app
    assert floor_violations({"growmem.app.continual": {"growmem.app.options"}}) == []


def test_kernels_are_told_apart_only_in_the_kernel_table():
    pattern = re.compile(r"""kernel\s*(==|!=|in)\s*[("'\[]|==\s*["'](linear|rbf|weighted_softmax)["']""")
    offenders = []
    for name, path in _modules().items():
        if name == "growmem.kernels":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_exception_class_of_growmem_is_a_growmem_error():
    """One error tree: ``except GrowmemError`` catches every error growmem raises on purpose (each may also
    keep a standard base, ValueError or FileNotFoundError, for callers that catch those)."""
    import importlib
    import inspect as pyinspect

    from growmem.errors import GrowmemError

    outside = []
    for name in sorted(_modules()):
        if name.endswith("__main__"):
            continue
        mod = importlib.import_module(name)
        for cls_name, cls in vars(mod).items():
            if pyinspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == name \
                    and not issubclass(cls, GrowmemError):
                outside.append(f"{name}.{cls_name}")
    assert outside == [], outside


def test_no_two_exception_classes_share_a_name():
    """An error is named once: ``except UnknownPresetError`` cannot mean two classes (config's preset file
    and repro's scale were both called that)."""
    import importlib
    import inspect as pyinspect

    seen = {}
    for name in sorted(_modules()):
        if name.endswith("__main__"):
            continue
        for cls_name, cls in vars(importlib.import_module(name)).items():
            if pyinspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == name:
                seen.setdefault(cls_name, set()).add(name)
    twice = {n: sorted(mods) for n, mods in seen.items() if len(mods) > 1}
    assert twice == {}, twice
    assert len(seen) > 15, sorted(seen)      # the walk found growmem's errors (not vacuous)


def test_every_module_over_600_lines_gives_its_reason_in_the_architecture_page():
    """issue 28's bar: a module over 600 lines has a one-line reason in docs/architecture.md (its table
    "Modules over 600 lines"), and the table lists no module that is back under."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    section = page.split("## Modules over 600 lines", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w.]+)` \| \S", section, re.M))
    long = {_module_name(p)[len("growmem."):] for p in ROOT.rglob("*.py")
            if "presets" not in p.relative_to(ROOT).parts and len(p.read_text().splitlines()) > 600}
    assert long - listed == set(), f"modules over 600 lines without a reason in docs/architecture.md: {long - listed}"
    assert listed - long == set(), f"docs/architecture.md lists modules no longer over 600 lines: {listed - long}"


def _steps(node, helpers=frozenset()) -> bool:
    """Whether ``node`` calls a ``.step``, ``.observe`` or ``.train`` attribute, a function named ``*step*`` (a
    jitted ``step_fn``) or one named ``train`` / ``observe`` (a callback handed to a loop), or a method of its
    own class (``self.NAME(...)``) in ``helpers`` (whose body steps: one call deep)."""
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr in ("step", "observe", "train"))
        or (isinstance(n.func, ast.Name) and ("step" in n.func.id or n.func.id in ("train", "observe")))
        or (isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"
            and n.func.attr in helpers))
        for n in ast.walk(node))


def _stepping_loops(sources=None):
    """``{"module.function"}`` (module without ``growmem.``) of every ``for``/``while`` loop in the package (or
    in ``sources``: ``{name: text}``) whose body steps a learner (:func:`_steps`), directly or through a method
    of its class that does."""
    found = set()
    sources = sources if sources is not None else {n: p.read_text() for n, p in _modules().items()}
    for name, text in sources.items():
        tree = ast.parse(text)
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        helpers = frozenset(f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
                            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _steps(f))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.For, ast.While)) or not _steps(node, helpers):
                continue
            f = node
            while f in parents and not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = parents[f]
            found.add(f"{name[len('growmem.'):]}.{getattr(f, 'name', '<module>')}")
    return found


def test_every_loop_that_steps_a_learner_is_fit_or_named_in_the_architecture_page():
    """issue 28's "one loop": the loops that call a learner's ``step`` / ``observe`` / ``train`` are train.fit
    and the few docs/architecture.md lists with what they loop over (layers of a step, tasks of a batch,
    experiences of a stream); a new training loop fails here until it goes through fit or is justified."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    section = page.split("## Loops that step a learner", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w.]+)` \| \S", section, re.M))
    found = _stepping_loops()
    assert "train.fit" in found and listed, (found, listed)         # the scan and the table are not vacuous
    # a loop that steps through a method of its class is found too (GrowmemStrategy's epoch went unseen)
    hidden = ("class S:\n    def update(self):\n        self.learner.step(1)\n"
              "    def epoch(self):\n        for b in range(3):\n            self.update()\n")
    assert _stepping_loops({"growmem.fake": hidden}) == {"fake.epoch"}
    assert found - listed == set(), f"loops stepping a learner outside train.fit, not in the page: {found - listed}"
    assert listed - found == set(), f"the page lists loops that are gone: {listed - found}"


#: the modules that may import pickle, and why (the architecture page's "Saving a run's state")
PICKLE_READERS = {"growmem.data.datasets": "reads CIFAR's published pickles with an unpickler that builds numpy "
                                          "arrays only, after their checksums"}


def test_state_is_saved_through_the_checkpointer_and_no_module_pickles_it():
    """One way to save a run's state: growmem's Checkpointer (Orbax, host arrays with checksums). A module
    importing pickle (or torch.save / joblib, which pickle) outside PICKLE_READERS fails here."""
    offenders = []
    for name, path in sorted(_modules().items()):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(m.split(".")[0] in ("pickle", "cPickle", "dill", "joblib", "cloudpickle") for m in mods) \
                    and name not in PICKLE_READERS:
                offenders.append(f"{name}: imports {mods}")
            if isinstance(node, ast.Attribute) and node.attr in ("save", "load") and \
                    isinstance(node.value, ast.Name) and node.value.id == "torch":
                offenders.append(f"{name}: torch.{node.attr} (a pickle) at line {node.lineno}")
    assert offenders == [], offenders
    assert set(PICKLE_READERS) <= set(_modules())          # each named reader exists (not vacuous)
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert "## Saving a run's state" in page and all(f"`{m.split('.', 1)[1]}`" in page for m in PICKLE_READERS)


def test_one_progress_bar_reporting_alone_imports_tqdm():
    """One progress bar (rate and ETA, the ``GROWMEM_PROGRESS`` rule): ``growmem.reporting.progress_bar``. A
    module building its own tqdm bar fails here."""
    importers = set()
    for name, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(m.split(".")[0] == "tqdm" for m in mods):
                importers.add(name)
    assert importers == {"growmem.reporting"}, importers   # the one bar is found (not vacuous), and no other


def test_the_progress_bar_follows_the_terminal_rule(monkeypatch, capsys):
    """Off where not enabled; on a pipe (pytest's captured stderr) silent unless GROWMEM_PROGRESS=1, which
    shows it anywhere; it starts at ``initial`` and may learn its total later."""
    from growmem.reporting import progress_bar

    assert progress_bar(10, "x", enabled=False) is None
    monkeypatch.delenv("GROWMEM_PROGRESS", raising=False)
    bar = progress_bar(10, "quiet", initial=3)
    assert bar.disable                        # stderr is not a terminal here
    bar.close()
    monkeypatch.setenv("GROWMEM_PROGRESS", "1")
    bar = progress_bar(None, "shown", initial=3, unit="batch")
    assert not bar.disable and bar.n == 3 and bar.total is None
    bar.total = 5
    bar.update(2)
    bar.close()
    err = capsys.readouterr().err
    assert "shown" in err and "5/5" in err and "quiet" not in err


#: the built-in exceptions the package may raise: an I/O failure its callers handle, Python's protocols (a
#: module's ``__getattr__``, an abstract method) and process control (an exit code, Ctrl-C passed on)
BUILTIN_RAISES = ("OSError", "AttributeError", "NotImplementedError", "SystemExit", "KeyboardInterrupt")


def test_growmem_raises_its_own_errors_and_no_built_in_one_but_oserror():
    """One error tree (docs/architecture.md): a ``raise`` of a built-in exception class (ValueError,
    TypeError, RuntimeError, ...) in the package fails here, but for :data:`BUILTIN_RAISES`."""
    import builtins

    found = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                f = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                cls = getattr(builtins, f.id, None) if isinstance(f, ast.Name) else None
                if isinstance(cls, type) and issubclass(cls, BaseException) and f.id not in BUILTIN_RAISES:
                    found.append(f"{name}:{node.lineno} raises {f.id}")
    assert found == [], found
    from growmem.errors import ConfigError, NumericalError, WrongTypeError   # what callers of the built-ins get
    assert issubclass(ConfigError, ValueError) and issubclass(WrongTypeError, TypeError)
    assert issubclass(NumericalError, FloatingPointError)
