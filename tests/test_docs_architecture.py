"""docs/architecture.md's tree and layer order are the package's: every part directly in inferlab/ and every module
of each package is named there, nothing else is, and the layers are listed in tests/layering.py's order."""

from __future__ import annotations

import re
from pathlib import Path

import layering

PAGE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
MODULE = re.compile(r"\b(\w+\.py)\b")


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def tree_entries(text: str) -> dict[str, str]:
    """The entries under `inferlab/` in the page's layout tree: name (protocol.py, base/) -> its whole description."""
    block = next(b for b in fenced_blocks(text) if re.search(r"^inferlab/ ", b, flags=re.MULTILINE))
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("inferlab/ "))
    entries: dict[str, str] = {}
    name = None
    for line in lines[start + 1:]:
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            break  # the next top-level folder
        if indent == 2:
            name, _, description = line.strip().partition(" ")
            assert name not in entries, f"{PAGE.name}: {name} is listed twice"
            entries[name] = description.strip()
        else:
            entries[name] += " " + line.strip()
    return entries


def layer_line(text: str) -> tuple:
    block = next(b for b in fenced_blocks(text) if " < " in b)
    return tuple(tuple(layer.split()) for layer in block.strip().split(" < "))


def disagreements(text: str) -> list[str]:
    """Where the page and the package differ: the parts directly in inferlab/, each package's modules, the layers."""
    entries = tree_entries(text)
    package = layering.PACKAGE
    actual = {"__init__.py"} | {f"{part}/" if (package / part).is_dir() else f"{part}.py" for part in layering.parts()}
    found = []
    if set(entries) != actual:
        found.append(f"{PAGE.name} lists {sorted(set(entries) - actual)} that inferlab/ lacks and lacks "
                     f"{sorted(actual - set(entries))}")
    for name, description in entries.items():
        if name.endswith("/") and name in actual:
            named = set(MODULE.findall(description)) - {"__init__.py"}
            modules = {p.name for p in (package / name).glob("*.py")} - {"__init__.py"}
            if named != modules:
                found.append(f"{name}: the page names {sorted(named - modules)} it lacks and leaves out "
                             f"{sorted(modules - named)}")
    if layer_line(text) != layering.LAYERS:
        found.append(f"layers: the page has {layer_line(text)}, tests/layering.py {layering.LAYERS}")
    return found


def test_the_page_names_every_part_every_module_and_the_layers_as_they_are():
    found = disagreements(PAGE.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_a_page_that_disagrees_is_caught():
    text = PAGE.read_text(encoding="utf-8")
    dropped = text.replace("cache_check.py, memory.py (tensor bytes", "cache_check.py, (tensor bytes")
    swapped = text.replace("< run < read <", "< read < run <")
    extra = text.replace("  plugin.py ", "  plugin2.py         a module that is not there\n  plugin.py ")
    assert dropped != text and swapped != text and extra != text
    assert disagreements(dropped) == ["measure/: the page names [] it lacks and leaves out ['memory.py']"]
    assert len(disagreements(swapped)) == 1 and disagreements(swapped)[0].startswith("layers:")
    assert disagreements(extra) == [f"{PAGE.name} lists ['plugin2.py'] that inferlab/ lacks and lacks []"]
