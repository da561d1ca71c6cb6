"""The floor plan stays true (ARCHITECTURE.md): the import contract, no circles, no private names
across modules, and no file in app/ above 600 lines but a method's own module.

The contract itself is ``.importlinter`` (import-linter: layers, and forbidden imports for the pure
core, the light client, storage and the workers). These tests run it, and show that it is not
vacuous: an upward import added to a copy of the sources, or one layer rule turned round, fails it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
CONFIG = ROOT / ".importlinter"

#: Files allowed above MAX_LINES: each is one calibration method's own module.
METHOD_MODULES = {
    "calibration/angular.py", "calibration/bernstein.py", "calibration/multicalibration.py", "calibration/selective.py",
}
MAX_LINES = 600
KNOWN_LONG_FILES: set[str] = set()

# Allowed exceptions to the two checks below: none today. An entry here needs a reason beside it.
KNOWN_CIRCLES: list[set[str]] = []
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()


def lint_imports(config: Path, source_root: Path | None = None) -> subprocess.CompletedProcess:
    """Run import-linter on ``config``, importing calibd from ``source_root`` (a copy) when given."""
    env = None
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filenames=(sys.argv[1],), no_cache=True, no_logo=True))"
    if source_root is not None:
        # The copy comes first on the path, before the editable install's finder.
        code = f"import sys; sys.path.insert(0, {str(source_root)!r}); " + code
    return subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, env=env, timeout=120)


def test_the_import_contract_holds():
    result = lint_imports(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.slow
def test_an_upward_import_breaks_the_contract(tmp_path):
    """A copy of the sources with one added import from the pure core up to the routes fails the check."""
    package = tmp_path / "calibd"
    shutil.copytree(APP, package, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    validation = package / "calibration" / "validation.py"
    validation.write_text(validation.read_text() + "\nfrom ..api import problems  # an arrow that runs back up\n")
    result = lint_imports(CONFIG, tmp_path)
    assert result.returncode != 0, result.stdout
    assert "Layers: imports run downward only BROKEN" in result.stdout
    assert "calibd.calibration.validation -> calibd.api.problems" in result.stdout
    assert "calibd.calibration.validation" in result.stdout and "fastapi" in result.stdout  # pure core too


def test_turning_one_layer_rule_round_breaks_the_contract(tmp_path):
    """With calibration put above the routes, the routes' real imports of calibration break it."""
    text = CONFIG.read_text()
    assert "    api\n" in text and "    calibration\n" in text
    swapped = text.replace("    api\n", "    @\n").replace("    calibration\n", "    api\n").replace("    @\n", "    calibration\n")
    config = tmp_path / "swapped.ini"
    config.write_text(swapped)
    result = lint_imports(config)
    assert result.returncode != 0, result.stdout
    assert "Layers: imports run downward only BROKEN" in result.stdout
    assert "calibd.api." in result.stdout and "-> calibd.calibration" in result.stdout


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("calibd", cache_dir=None)


def _circles(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan), where a module's
    ``from . import submodule`` of its own package does not count as importing the package."""

    def imports(module: str) -> list[str]:
        out = []
        for imported in graph.find_modules_directly_imported_by(module):
            if module.startswith(imported + "."):
                details = graph.get_import_details(importer=module, imported=imported)
                if details and all(d["line_contents"].startswith("from . import ") for d in details):
                    continue
            out.append(imported)
        return out

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative Tarjan: no recursion limit
        nonlocal counter
        work = [(start, iter(imports(start)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(imports(child))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_circles():
    circles = _circles(_graph())
    unexpected = [sorted(c) for c in circles if c not in KNOWN_CIRCLES]
    assert unexpected == []


def test_the_circle_finder_finds_a_circle():
    graph = _graph()
    graph.add_import(importer="calibd.inputs", imported="calibd.calibration.base")
    assert any({"calibd.inputs", "calibd.calibration.base"} <= c for c in _circles(graph))


def _module_name(path: Path, root: Path = APP) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["calibd", *parts])


def private_imports(root: Path = APP) -> set[tuple[str, str]]:
    """(importing module, name) for every ``from <calibd module> import _name`` that takes a
    private name out of another module (a private submodule of the package is not a name)."""
    found = set()
    for path in root.rglob("*.py"):
        module = _module_name(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("calibd"):
                continue
            source_path = root.joinpath(*source.split(".")[1:])
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if (source_path / name).with_suffix(".py").exists() or list(source_path.glob(f"{name}.*.so")) or (source_path / name).is_dir():
                    continue  # a private submodule of that package
                found.add((module, name))
    return found


def test_no_module_imports_another_modules_private_names():
    assert private_imports() - KNOWN_PRIVATE_IMPORTS == set()


def test_the_private_import_check_finds_one(tmp_path):
    package = tmp_path / "app"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("def _hidden():\n    pass\n")
    (package / "sub" / "_fast.py").write_text("")
    (package / "sub" / "b.py").write_text("from .a import _hidden\nfrom . import _fast\nfrom calibd.sub.a import _hidden as h\n")
    assert private_imports(package) == {("calibd.sub.b", "_hidden")}


def line_counts(root: Path = APP) -> dict[str, int]:
    return {str(path.relative_to(root)): len(path.read_text().splitlines()) for path in sorted(root.rglob("*.py"))}


def test_no_file_in_app_is_above_600_lines_but_a_methods_own_module():
    too_long = {path: n for path, n in line_counts().items() if n > MAX_LINES and path not in METHOD_MODULES | KNOWN_LONG_FILES}
    assert too_long == {}
