"""The layers of inferlab, lowest first, and its imports read from the source (ast, nothing imported): what the
layering test and the architecture page's test check. docs/architecture.md states the same order."""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "inferlab"

# Each layer names the parts directly in inferlab/ (a module without .py, or a package). A module may import from
# its own part and from any lower layer, never from a higher one or from another part of its own layer.
LAYERS = (
    ("protocol", "files", "hookspec", "writing"),
    ("host",),
    ("specimen",),
    ("measure",),
    ("run",),
    ("read",),
    ("report",),
    ("grade",),
    ("cli",),
    ("plugin", "__main__", "standin", "replica"),
)


@dataclass(frozen=True)
class Import:
    """One import of an inferlab module: where it is (file, line) and the module it resolves to."""

    module: str  # the importing module, dotted (inferlab.measure.sampling)
    file: str
    line: int
    target: str  # the imported inferlab module, dotted (a package's name for its __init__.py)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def part_of(module: str) -> str:
    """The part of inferlab a module belongs to: inferlab.measure.sampling -> measure; the root package -> ''."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else ""


def _resolve(name: str, known: dict) -> str | None:
    """The longest known module a dotted name starts with (an imported function resolves to its module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(package: Path = PACKAGE) -> list[Import]:
    """Every import of an inferlab module by a module of the package, at any depth (inside functions too)."""
    known = modules(package)
    found = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for name in names:
                target = _resolve(name, known) if name.split(".")[0] == package.name else None
                if target is not None and target != module:
                    found.append(Import(module, str(path.relative_to(package.parent)), node.lineno, target))
    return found


def upward_imports(found: list[Import], layers=LAYERS) -> list[str]:
    """One line per import that goes up, or across to another part of the same layer."""
    index = {part: number for number, layer in enumerate(layers) for part in layer}  # 0 the lowest
    lines = []
    for item in found:
        source, target = part_of(item.module), part_of(item.target)
        if not target or source == target:
            continue  # the root package (its __init__ imports nothing), or within one part
        if index[target] >= index[source]:
            where = "the same layer" if index[target] == index[source] else "a higher layer"
            lines.append(f"{item.file}:{item.line}: {item.module} imports {item.target}, from {where} ({target} is in "
                         f"layer {index[target]}, {source} in layer {index[source]})")
    return lines


def cycles(found: list[Import]) -> list[str]:
    """An import cycle among modules ([a, b, ..., a], as graphlib finds it), or [] when there is none."""
    graph: dict[str, set] = {}
    for item in found:
        graph.setdefault(item.module, set()).add(item.target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return []


def parts(package: Path = PACKAGE) -> set[str]:
    """What lies directly in the package: its modules (without .py) and its packages."""
    return ({p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
            | {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()})
