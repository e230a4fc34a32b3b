"""The package keeps its layers (docs/runtime.md, "Layout"): rendering <- errors <- runtime <- jit <- dispatch <-
the compiler <- the feature packages (amp, cuda_alias, distributed, fused) <- the tools <- api <- cli <- notebook,
and fl_magics above all of it. Three checks, all on the source as written:

* import-linter's contracts in pyproject.toml ([tool.importlinter]): a layer imports only the layers below
  it, directly or through any chain of imports; the compiler and the dispatcher never import a tool;
  torch_fl never imports fl_magics;
* no import circle between two modules of torch_fl (or fl_magics), counting every import in a module,
  function-local ones included, read from the syntax tree: a circle through a lazy import is a circle that
  the laziness only hides;
* the rules import-linter cannot state, read from the syntax tree: no underscore name is imported from
  another module (nor read as an attribute of an imported torch_fl module), and a module outside
  runtime/, jit/ or dispatch/ imports from them only through the package, only the names its `__all__`
  exports."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGES = ("torch_fl", "fl_magics")
LAYER_PACKAGES = ("torch_fl.runtime", "torch_fl.jit", "torch_fl.dispatch")  # imported through their __init__


def _lint_imports(cwd: str, config: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo", config],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
    )


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter")
    r = _lint_imports(ROOT, os.path.join(ROOT, "pyproject.toml"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken." in r.stdout, r.stdout[-2000:]


def _copy_sources(dst: str) -> None:
    for package in PACKAGES:
        shutil.copytree(
            os.path.join(ROOT, package),
            os.path.join(dst, package),
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.h", "*.cpp"),
        )


LAYERS = "torch_fl's layers import only the layers below them"


@pytest.mark.parametrize(
    "module, line, contract, broken",
    [
        # the runtime reaching up into the dispatcher, in a lazy import inside a function
        (
            "torch_fl/runtime/registry.py",
            "def _peek():\n    from ..dispatch import facts\n    return facts\n",
            LAYERS,
            "torch_fl.runtime.registry -> torch_fl.dispatch",
        ),
        # a generator calling back into the dispatcher
        (
            "torch_fl/jit/kernel.py",
            "from ..dispatch import resolve  # noqa\n",
            LAYERS,
            "torch_fl.jit.kernel -> torch_fl.dispatch",
        ),
        # the compiler measuring itself with a tool, lazily
        (
            "torch_fl/compile/replay.py",
            "def _peek():\n    from ..tools import profiler\n    return profiler\n",
            "the compiler never imports a tool",
            "torch_fl.compile.replay -> torch_fl.tools.profiler",
        ),
        # the dispatcher judging numbers with a tool's rule
        (
            "torch_fl/dispatch/plan.py",
            "from ..tools.numerics import BAND  # noqa\n",
            "the dispatcher never imports a tool",
            "torch_fl.dispatch.plan -> torch_fl.tools.numerics",
        ),
        # torch_fl importing the magics
        (
            "torch_fl/tools/profiler.py",
            "import fl_magics  # noqa\n",
            "fl_magics is a thin layer over torch_fl, which never imports it",
            "torch_fl.tools.profiler -> fl_magics",
        ),
    ],
)
def test_a_broken_layer_fails_the_check(tmp_path, module, line, contract, broken):
    """The same contracts on a copy of the sources with one import that breaks a layer: lint-imports fails
    and names the import (so a passing run above means something)."""
    pytest.importorskip("importlinter")
    _copy_sources(str(tmp_path))
    with open(tmp_path / module, "a") as f:
        f.write("\n\n" + line)
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    r = _lint_imports(str(tmp_path), str(tmp_path / "pyproject.toml"), env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode != 0, r.stdout[-3000:]
    assert f"{contract} BROKEN" in r.stdout and broken in r.stdout, r.stdout[-3000:]


# -- the rules read from the syntax tree --------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Tree:
    """The modules of a source tree (torch_fl, fl_magics and the autoload module) by dotted name."""

    def __init__(self, root: str):
        self.root = root
        self.files: dict[str, str] = {}
        for package in PACKAGES:
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for name in filenames:
                    if name.endswith(".py"):
                        path = os.path.join(dirpath, name)
                        rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                        self.files[rel.removesuffix(".__init__")] = path
        autoload = os.path.join(root, "torch_fl_autoload.py")
        if os.path.exists(autoload):
            self.files["torch_fl_autoload"] = autoload

    def is_package(self, module: str) -> bool:
        return self.files.get(module, "").endswith("__init__.py")

    def is_module(self, module: str) -> bool:
        return module in self.files

    def resolve(self, module: str, level: int, name: str | None) -> str:
        """The absolute name a `from <dots><name> import ...` in `module` means."""
        if not level:
            return name or ""
        parts = module.split(".")
        base = parts if self.is_package(module) else parts[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    def exported(self, package: str) -> set[str]:
        tree = ast.parse(open(self.files[package]).read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                return set(ast.literal_eval(node.value))
        return set()


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES + ("torch_fl_autoload",)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def underscore_crossings(root: str) -> list[str]:
    """Every place a module of the tree imports an underscore name from another module of the tree, or
    reads one as an attribute of an imported module of the tree."""
    t = _Tree(root)
    found = []
    for module, path in sorted(t.files.items()):
        tree = ast.parse(open(path).read(), path)
        aliases: dict[str, str] = {}  # local name -> module of the tree it is bound to
        rel = os.path.relpath(path, root)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = t.resolve(module, node.level, node.module)
                if not _ours(target):
                    continue
                if any(_private(p) for p in target.split(".")):
                    found.append(f"{rel}:{node.lineno}: from {target} import ... (a private module)")
                for a in node.names:
                    if _private(a.name):
                        found.append(f"{rel}:{node.lineno}: from {target} import {a.name}")
                    if t.is_module(f"{target}.{a.name}"):
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if not _ours(a.name):
                        continue
                    if any(_private(p) for p in a.name.split(".")):
                        found.append(f"{rel}:{node.lineno}: import {a.name}")
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in aliases:
                continue
            prefix = aliases[base.id]
            for part in chain:  # only while the prefix is one of our modules: past it, it is an object's attribute
                if not t.is_module(prefix):
                    break
                if _private(part):
                    found.append(f"{rel}:{node.lineno}: {base.id}.{'.'.join(chain)} ({prefix}.{part})")
                    break
                prefix = f"{prefix}.{part}"
    return sorted(set(found))


def layer_bypasses(root: str) -> list[str]:
    """Every import of a module of runtime/, jit/ or dispatch/ from outside that package, and every import
    from the package of a name its __all__ does not export."""
    t = _Tree(root)
    found = []
    for module, path in sorted(t.files.items()):
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            imports = []
            if isinstance(node, ast.ImportFrom):
                target = t.resolve(module, node.level, node.module)
                imports = [(target, [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                imports = [(a.name, []) for a in node.names]
            for target, names in imports:
                for package in LAYER_PACKAGES:
                    if _within(module, package) or not _within(target, package):
                        continue
                    where = f"{os.path.relpath(path, root)}:{node.lineno}"
                    if target != package:
                        found.append(f"{where}: imports {target}, inside {package} (import from {package} instead)")
                        continue
                    missing = sorted(set(names) - t.exported(package))
                    if missing:
                        found.append(f"{where}: imports {', '.join(missing)} from {package}, which does not export it")
    return found


def import_edges(root: str) -> dict[str, dict[str, list[int]]]:
    """module -> {module of the tree it imports: the lines that import it}, for every module of the tree. Every
    import statement counts wherever it stands (module level, inside a function, under an `if`); importing a
    submodule does not count as importing its parent packages (as grimp, import-linter's graph, counts)."""
    t = _Tree(root)
    edges: dict[str, dict[str, list[int]]] = {}
    for module, path in sorted(t.files.items()):
        out = edges.setdefault(module, {})
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.ImportFrom):
                base = t.resolve(module, node.level, node.module)
                targets = [f"{base}.{a.name}" if t.is_module(f"{base}.{a.name}") else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target and not t.is_module(target):  # `import pkg.mod.name` reaches module pkg.mod
                    target = target.rpartition(".")[0]
                if target and target != module:
                    out.setdefault(target, []).append(node.lineno)
    return edges


def import_cycles(root: str) -> list[str]:
    """One import circle per strongly connected group of modules, each step with the line that imports."""
    edges = import_edges(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    found = []
    for group in groups:  # the shortest circle through the group's first module, found breadth first
        inside, start = set(group), group[0]
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from:
            reached = []
            for v in frontier:
                for w in sorted(edges[v]):
                    if w in inside and w not in came_from:
                        came_from[w] = v
                        reached.append(w)
            frontier = reached
        path, v = [start], came_from[start]
        while v != start:
            path.insert(0, v)
            v = came_from[v]
        path.insert(0, start)
        steps = [f"{a} (line {edges[a][b][0]}) -> {b}" for a, b in zip(path, path[1:], strict=False)]
        found.append(f"{len(group)} modules: " + "; ".join(steps))
    return found


def test_no_import_circles():
    found = import_cycles(ROOT)
    assert not found, (
        "import circles (move the dependency to the layer that needs it, e.g. a registration the "
        "upper layer installs; a function-local import hides a circle, it does not break it):\n" + "\n".join(found)
    )


def test_the_circle_check_sees_function_local_imports(tmp_path):
    """On a copy of the sources: a lazy import inside a function that closes a circle (the memory settings
    asking the registry, which makes the pools) is reported with both modules and its line."""
    _copy_sources(str(tmp_path))
    assert import_cycles(str(tmp_path)) == import_cycles(ROOT)
    with open(tmp_path / "torch_fl" / "runtime" / "memory.py", "a") as f:
        f.write("\n\ndef _peek():\n    from .registry import REGISTRY\n    return REGISTRY\n")
    found = import_cycles(str(tmp_path))
    assert len(found) == 1 and "torch_fl.runtime.memory (line" in found[0], found
    assert "-> torch_fl.runtime.registry" in found[0], found


def test_no_underscore_name_crosses_a_module():
    found = underscore_crossings(ROOT)
    assert not found, (
        "underscore names used across modules (give them a plain name in their home module):\n" + "\n".join(found)
    )


def test_the_lower_layers_are_imported_only_through_their_packages():
    found = layer_bypasses(ROOT)
    assert not found, "\n".join(found)


def test_the_syntax_checks_catch_what_they_are_for(tmp_path):
    """Both syntax-tree checks on a copy of the sources with one violation each: they report it."""
    _copy_sources(str(tmp_path))
    with open(tmp_path / "torch_fl" / "tools" / "profiler.py", "a") as f:
        f.write(
            textwrap.dedent("""

            def _peek():
                from ..runtime.registry import REGISTRY
                from ..runtime import native
                from ..api import _dtype
                return REGISTRY, native._LAYOUT_CACHE, _dtype
            """)
        )
    crossings = underscore_crossings(str(tmp_path))
    assert any("from torch_fl.api import _dtype" in c for c in crossings), crossings
    assert any("native._LAYOUT_CACHE" in c for c in crossings), crossings
    bypasses = layer_bypasses(str(tmp_path))
    assert any("imports torch_fl.runtime.registry, inside torch_fl.runtime" in b for b in bypasses), bypasses


@pytest.mark.slow  # a subprocess
def test_ruff_finds_nothing():
    """`ruff check` over the whole tree (its rules: [tool.ruff] in pyproject.toml) is part of the test command,
    so a lint finding fails it like any other test instead of waiting for someone to run ruff by hand."""
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (it comes with torch_fl's test extra: pip install 'torch_fl[test]')")
    r = subprocess.run(
        [ruff, "check", "--no-cache", "--output-format", "concise", ROOT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow  # a subprocess
def test_ruff_format_finds_nothing():
    """The tree is as `ruff format` writes it ([tool.ruff.format]; the notebook sources are the built notebooks'
    text and keep theirs), so a diff shows changes, never a reformatting."""
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (it comes with torch_fl's test extra: pip install 'torch_fl[test]')")
    r = subprocess.run(
        [ruff, "format", "--check", "--no-cache", ROOT], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


SOURCE_SUFFIXES = (".py", ".c", ".h", ".cpp", ".cl")
SKIP_DIRS = {
    ".git",
    "build",
    "dist",
    ".venv",
    "venv",
    "__pycache__",
    ".ipynb_checkpoints",
    ".ruff_cache",
    ".pytest_cache",
    ".mypy_cache",
    "include",
    "test-artifacts",
}


def test_no_source_file_over_1000_lines():
    """A file over 1,000 lines holds more than one topic; split it by topic (CONTRIBUTING.md). Generated copies
    (torch_fl/runtime/include, the shipped headers) and build outputs are not sources."""
    long = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    n = sum(1 for _ in f)
                if n > 1000:
                    long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, long
