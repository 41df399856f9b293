"""The layering of docs/architecture.md, checked on the source: imports run one way, and there is no cycle."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "elastic_reset"

# Lower number = lower layer. A module may import its own part and lower layers, never a higher one.
LAYERS = {
    "errors": 0,
    "io": 1, "core": 1, "data": 1,
    "lm": 2, "models": 2, "integrations": 2,
    "rewards": 3, "pretrain": 3, "reward_models": 3,
    "tasks": 4,
    "evaluation": 5,
    "rl": 6,
    "compare": 7,
    "demo": 8,
    "cli": 9,
    "__init__": 9,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts)] = path
    return out


def _imports(path: Path, root: Path = PACKAGE) -> set[str]:
    """Every ``elastic_reset.*`` module this file imports, at any depth (lazy imports inside functions count);
    relative imports are resolved against the file's package."""
    found = set()
    package = path.relative_to(root).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[:len(package) - node.level + 1] + ((node.module,) if node.module else ()))
            if base:
                found.add(base)
            found.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("elastic_reset"):
            base = node.module.removeprefix("elastic_reset").lstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("elastic_reset.") for a in node.names
                         if a.name.startswith("elastic_reset."))
    return found


def _part(module: str) -> str:
    return module.split(".")[0]


def test_every_part_has_a_layer():
    assert {_part(m) for m in _modules()} <= set(LAYERS), "a new top-level module needs a layer here and in the doc"


def test_imports_run_downwards():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        for target in _imports(path):
            if target not in modules and _part(target) not in LAYERS:
                continue  # a name imported from a module (from x import y), checked through x
            src, dst = _part(name), _part(target)
            if src != dst and LAYERS[dst] >= LAYERS[src] and name != "__init__":
                wrong.append(f"{name} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {name: {t for t in _imports(path) if t in modules and t != name} for name, path in modules.items()}
    # A package's __init__ re-exporting its modules is not a cycle of behaviour; leave package inits out.
    graph = {n: {t for t in ts if not modules[t].name == "__init__.py"} for n, ts in graph.items()
             if modules[n].name != "__init__.py"}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return stack + [node, nxt]
            if nxt not in state and (cycle := visit(nxt, stack + [node])):
                return cycle
        state[node] = 2
        return None

    for start in graph:
        if start not in state:
            cycle = visit(start, [])
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_relative_imports_are_resolved_against_the_package(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "x.py").write_text("from ..cli import main\nfrom . import trainer\nfrom .ops import f\n")
    found = _imports(tmp_path / "rl" / "x.py", root=tmp_path)
    assert found == {"cli", "cli.main", "rl", "rl.trainer", "rl.ops", "rl.ops.f"}


def test_the_code_and_its_scripts_speak_of_the_project_not_of_its_development():
    # Issue and session numbers belong to git history.
    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True).stdout.split()
    if not listed:
        pytest.skip("not a git checkout")
    pattern = re.compile(r"\b([Ii]ssues?|[Ss]essions?)[ -]\d+")  # "TRL issue #3108" is another tracker
    kept = re.compile(r"^((src|docs|tests|benchmarks|experiments|configs)/.*\.(py|sh|yaml|md)"
                      r"|(README|BENCHMARKS)\.md)$")
    results = re.compile(r"^(experiments/[^/]+/results|benchmarks/results)/")
    found = [f"{name}:{n}: {line.strip()[:80]}" for name in listed if kept.match(name) and not results.match(name)
             and (root / name).is_file()
             for n, line in enumerate((root / name).read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line) and "pattern = re.compile" not in line]
    assert not found, "\n".join(found)
    named = [name for name in listed if re.search(r"(issue|session)_?\d", name, re.IGNORECASE)]
    assert not named, "paths: " + ", ".join(named)


def test_the_training_loop_names_no_component():
    # Selective Rehearsal and a reward that learns reach the loop through the hooks (rl/components.py), as methods do
    tree = ast.parse((PACKAGE / "rl" / "trainer.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    named = sorted(n for n in names if re.search(r"rehears|learned|listener", n, re.IGNORECASE))
    assert not named, named
