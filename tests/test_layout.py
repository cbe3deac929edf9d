"""The package's layout, read from its own imports: no import cycle, the runtime hook and the
file formats free of the solver, the lower layers never importing the upper ones.

Run it as a script for the figures the layout is judged by (modules, lines, import floors, cycles):
`.venv/bin/python tests/test_layout.py`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "freezeopt"

LAYERS = {
    "freezeopt.formats": 1,
    "freezeopt.model": 2,
    "freezeopt.solver": 3,
    "freezeopt.torchpp": 3,
    "freezeopt.profiling": 4,
    "freezeopt.hf": 4,
    "freezeopt.tracking": 4,
    "freezeopt.training": 5,
    "freezeopt.compare": 6,
    "freezeopt.torchtitan": 6,
}
"""Each sub-package's floor: a module may import its own package, those on lower floors, and the
top-level modules below every package (`actions`, `errors`, `fileio`, `procs`). `examples` (user
code) may import anything; the CLI and the top-level face sit above all. `hf` (Hugging Face models
as jobs) is profiling input: the job spec names it as a string, it imports the job contract.
`torchtitan` is a trainer: torchtitan's, replaying schedules with the runtime hook."""
BASE = {"freezeopt.actions", "freezeopt.errors", "freezeopt.fileio", "freezeopt.procs", "freezeopt"}
"""Modules any package may import (`freezeopt` itself for `__version__`)."""
SOLVER_LIBS = {"pulp", "networkx", "highspy", "numba", "matplotlib", "torch"}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = f
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the package's modules it imports anywhere (lazy and type-only imports included:
    a cycle through a function-level import is still a cycle in the design). A package's face
    importing its own children is not counted."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = m.split(".") if is_pkg else m.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join(here + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            for n in names:
                while n and n not in mods and "." in n:
                    n = n.rsplit(".", 1)[0]
                if n in mods and n != m and not (is_pkg and n.startswith(m + ".")):
                    edges[m].add(n)
    for m in edges:  # `from freezeopt.x import y` where y is a module: drop the package edge
        edges[m] = {n for n in edges[m] if not any(o.startswith(n + ".") for o in edges[m])}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def floors(edges: dict[str, set[str]]) -> int:
    """The longest import chain, counted in modules (modules of one cycle count as one)."""
    comp_of = {m: i for i, c in enumerate(cycles(edges)) for m in c}
    node = {m: comp_of.get(m, m) for m in edges}
    deps: dict[object, set[object]] = {}
    for m, ns in edges.items():
        deps.setdefault(node[m], set()).update(node[n] for n in ns if node[n] != node[m])
    depth: dict[object, int] = {}

    def d(v: object) -> int:
        if v not in depth:
            depth[v] = 0  # guards nothing but recursion on a malformed graph
            depth[v] = 1 + max((d(w) for w in deps.get(v, ())), default=0)
        return depth[v]

    sys.setrecursionlimit(10_000)
    return max(d(v) for v in deps)


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between sub-packages (a top-level module stands for itself)."""

    def pkg(m: str) -> str:
        parts = m.split(".")
        sub = ".".join(parts[:2])
        return sub if len(parts) > 2 or (sub + ".") in {n[: len(sub) + 1] for n in edges} else m

    out: dict[str, set[str]] = {}
    for m, ns in edges.items():
        out.setdefault(pkg(m), set()).update(pkg(n) for n in ns if pkg(n) != pkg(m))
    return out


def loaded_by(*names: str) -> dict[str, list[str]]:
    """Import `names` in a fresh interpreter; the freezeopt modules and heavy libraries loaded."""
    probe = (
        "import importlib, json, sys\n"
        f"for n in {list(names)!r}: importlib.import_module(n)\n"
        "print(json.dumps({'freezeopt': sorted(m for m in sys.modules if m.startswith('freezeopt')),"
        f" 'heavy': sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(SOLVER_LIBS)!r}))}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    return json.loads(out.stdout)


def layer_of(m: str) -> int | None:
    for pkg, floor in LAYERS.items():
        if m == pkg or m.startswith(pkg + "."):
            return floor
    return None


def test_no_import_cycle() -> None:
    assert cycles(imports(modules())) == []


def test_lower_layers_never_import_upper_ones() -> None:
    wrong = []
    for m, ns in imports(modules()).items():
        mine = layer_of(m)
        if mine is None:
            continue
        for n in ns:
            theirs = layer_of(n)
            ok = n in BASE or (theirs is not None and theirs <= mine)
            ok = ok or n.startswith("freezeopt.examples")  # the built-in job, looked up by name
            if not ok or (theirs == mine and n.split(".")[1] != m.split(".")[1]):
                wrong.append(f"{m} -> {n}")
    assert wrong == []


def test_runtime_hook_and_formats_load_no_solver() -> None:
    got = loaded_by(
        "freezeopt.training.runtime", "freezeopt.formats.schedule", "freezeopt.formats.profile"
    )
    assert got["heavy"] == []
    assert not [
        m for m in got["freezeopt"] if m.startswith(("freezeopt.solver", "freezeopt.model"))
    ]


def test_import_freezeopt_is_cheap() -> None:
    got = loaded_by("freezeopt")
    assert got["heavy"] == []
    assert got["freezeopt"] == ["freezeopt"]


def test_default_paths_never_load_transformers() -> None:
    """The Hugging Face extra is optional: `import freezeopt`, the job spec, the runtime hook and
    `freezeopt.hf`'s own face load no `transformers` (its functions import it when called)."""
    names = ["freezeopt", "freezeopt.torchpp.job", "freezeopt.training.runtime", "freezeopt.hf"]
    probe = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'tokenizers', 'gguf'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "[]"


def test_no_package_face_hides_one_of_its_modules() -> None:
    """`from freezeopt.model import simulate` must be the module: a package that re-exported a
    function of that name would make `import freezeopt.model.simulate as m` the function."""
    import importlib
    import pkgutil

    hidden = []
    for m in modules():
        if (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists():
            pkg = importlib.import_module(m)
            subs = {info.name for info in pkgutil.iter_modules(pkg.__path__)}
            hidden += [f"{m}.{n}" for n in subs & set(getattr(pkg, "__all__", ()))]
    assert hidden == []


def test_every_public_name_resolves_to_its_module() -> None:
    import freezeopt

    for name in freezeopt.__all__:
        value = getattr(freezeopt, name)
        if name != "__version__":
            assert value.__module__ == freezeopt._PUBLIC[name], name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        freezeopt.nope  # noqa: B018


def main() -> None:
    mods = modules()
    edges = imports(mods)
    sizes = sorted(((len(f.read_text().splitlines()), m) for m, f in mods.items()), reverse=True)
    hook = loaded_by("freezeopt.training.runtime")
    print(f"modules: {len(mods)}; lines: {sum(n for n, _ in sizes)}")
    print(
        f"import floors (longest chain): {floors(edges)} modules, {floors(packages(edges))} packages"
    )
    print(f"cycles: {cycles(edges) or 'none'}")
    print(f"the runtime hook loads {len(hook['freezeopt'])} freezeopt modules: {hook['freezeopt']}")
    print(f"and of the heavy libraries: {hook['heavy'] or 'none'}")
    print("over 600 lines: " + (", ".join(f"{m} {n}" for n, m in sizes if n > 600) or "none"))


if __name__ == "__main__":
    main()
