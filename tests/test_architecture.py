"""The import rules of docs/architecture.md, checked on the source with ``ast``.

Every import counts: at module level, inside functions (the lazy ones) and under
``TYPE_CHECKING``, because a cycle hidden behind any of them is still a cycle of
the design.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clustersim"
DOC = ROOT / "docs" / "architecture.md"
LEAVES = frozenset({"units", "errors", "names", "progress", "terminal", "_version"})
MAX_LINES = 500
NETWORK_MAX_LINES = 500
ROOT_PKG = "<root>"
NETWORK = "clustersim.network"


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module an imported dotted name lives in (``a.b.c`` -> ``a.b`` if c is a name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "clustersim":
                    yield _resolve(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "clustersim":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield (full if full in MODULES else _resolve(target)), node.lineno


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, without self-imports."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        edges: dict[str, int] = {}
        for target, line in _imports(module, path):
            if target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


GRAPH = _graph()


def _package(module: str) -> str:
    """The top-level unit a module belongs to: ``clustersim.sim.run`` -> ``sim``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_PKG


def parse_rules(text: str) -> dict[str, frozenset[str] | None]:
    """package -> the packages it may import (None: anything), from the doc's list."""
    block = re.search(r"<!-- import rules: begin -->(.*?)<!-- import rules: end -->", text, re.S)
    if block is None:
        raise ValueError("docs/architecture.md has no import rules block")
    rules: dict[str, frozenset[str] | None] = {}
    for line in block.group(1).strip().splitlines():
        m = re.fullmatch(r"- (.+?): (.+)", line.strip())
        if m is None:
            raise ValueError(f"unreadable import rule: {line!r}")
        names = re.findall(r"`([\w]+)`", m.group(1))
        allowed: frozenset[str] | None
        if m.group(2).strip() == "anything":
            allowed = None
        elif m.group(2).strip() == "nothing":
            allowed = frozenset()
        else:
            allowed = frozenset(re.findall(r"`([\w]+)`", m.group(2)))
        for name in names:
            rules[name] = allowed
    return rules


RULES = parse_rules(DOC.read_text(encoding="utf-8"))


def parse_layers(text: str) -> dict[str, frozenset[str] | None]:
    """network layer -> the layers it may import (None: anything), from the doc's list."""
    block = re.search(
        r"<!-- network layers: begin -->(.*?)<!-- network layers: end -->", text, re.S
    )
    if block is None:
        raise ValueError("docs/architecture.md has no network layers block")
    return parse_rules(f"<!-- import rules: begin -->{block.group(1)}<!-- import rules: end -->")


LAYERS = parse_layers(DOC.read_text(encoding="utf-8"))


def _layer(module: str) -> str | None:
    """The layer of a module of ``network``: its subpackage, or the top module's own name
    (``__init__`` for the package itself); None outside ``network``."""
    if module != NETWORK and not module.startswith(NETWORK + "."):
        return None
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def _subpackages() -> frozenset[str]:
    return frozenset(
        p.parent.name for p in (PACKAGE / "network").glob("*/__init__.py") if p.parent.name
    )


def layer_violations(
    graph: dict[str, dict[str, int]], layers: dict[str, frozenset[str] | None]
) -> list[str]:
    """Imports inside ``network`` from one layer into another that the layers do not allow."""
    out = []
    for module, edges in graph.items():
        src = _layer(module)
        if src is None:
            continue
        allowed = layers.get(src, frozenset())
        for target, line in edges.items():
            dst = _layer(target)
            if dst is None or dst == src or allowed is None:
                continue
            if dst not in allowed:
                out.append(
                    f"{_where(module, line)}: network.{src} imports network.{dst} ({target})"
                )
    return out


def outside_reaching_in(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports from outside ``network`` of a module inside one of its subpackages."""
    subpackages = {f"{NETWORK}.{name}" for name in _subpackages()}
    out = []
    for module, edges in graph.items():
        if _layer(module) is not None:
            continue
        for target, line in edges.items():
            if _layer(target) is None or target == NETWORK or target in subpackages:
                continue
            if target.count(".") == 2 and not (PACKAGE / "network" / target.split(".")[2]).is_dir():
                continue  # a module of the top layer (microbench)
            out.append(f"{_where(module, line)}: imports {target}, inside a network subpackage")
    return out


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def violations(
    graph: dict[str, dict[str, int]], rules: dict[str, frozenset[str] | None]
) -> list[str]:
    """Imports from one package into another that the rules do not allow."""
    out = []
    for module, edges in graph.items():
        src = _package(module)
        if src in (ROOT_PKG, "__main__"):
            continue
        allowed = rules.get(src, frozenset())
        for target, line in edges.items():
            dst = _package(target)
            if dst == src or allowed is None:
                continue
            if dst in LEAVES:
                continue
            if dst not in allowed:
                out.append(f"{_where(module, line)}: {src} imports {dst} ({target})")
    return out


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start, first in graph.items():
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(first))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _uncovered(
    units: set[str], rules: dict[str, frozenset[str] | None]
) -> tuple[list[str], list[str]]:
    """The units that have no rule, and the names the rules allow that are no unit."""
    unknown = {d for allowed in rules.values() if allowed for d in allowed} - units
    return sorted(units - set(rules)), sorted(unknown)


def test_the_rules_cover_every_package() -> None:
    missing, unknown = _uncovered({_package(m) for m in MODULES} - {ROOT_PKG, "__main__"}, RULES)
    assert not missing, f"docs/architecture.md has no import rule for {missing}"
    assert not unknown, f"import rules name packages that do not exist: {unknown}"


def test_imports_follow_the_rules() -> None:
    broken = violations(GRAPH, RULES)
    assert not broken, "imports against docs/architecture.md:\n" + "\n".join(broken)


def test_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_nothing_imports_cli() -> None:
    bad = [
        f"{_where(m, line)}: imports {t}"
        for m, edges in GRAPH.items()
        for t, line in edges.items()
        if t in ("clustersim.cli", "clustersim.cli_args")
        and m not in ("clustersim.cli", "clustersim.__main__")
        and (m, t) != ("clustersim.docgen", "clustersim.cli_args")
    ]
    assert not bad, "\n".join(bad)


def test_nothing_inside_imports_the_package_root() -> None:
    bad = [
        f"{_where(m, line)}: imports the package root"
        for m, edges in GRAPH.items()
        for t, line in edges.items()
        if t == "clustersim" and m != "clustersim"
    ]
    assert not bad, "\n".join(bad)


def test_the_network_layers_cover_every_subpackage() -> None:
    missing, unknown = _uncovered({x for m in MODULES if (x := _layer(m)) is not None}, LAYERS)
    assert not missing, f"docs/architecture.md has no network layer for {missing}"
    assert not unknown, f"network layers name layers that do not exist: {unknown}"


def test_network_imports_follow_its_layers() -> None:
    broken = layer_violations(GRAPH, LAYERS)
    assert not broken, "imports against the network layers:\n" + "\n".join(broken)


def test_code_outside_network_imports_its_subpackages_only() -> None:
    broken = outside_reaching_in(GRAPH)
    assert not broken, "\n".join(broken)


def _longer_than(limit: int, paths: list[Path]) -> dict[str, int]:
    return {
        str(p.relative_to(ROOT)): n
        for p in paths
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit
    }


def test_network_modules_stay_under_their_line_limit() -> None:
    long = _longer_than(NETWORK_MAX_LINES, [p for m, p in MODULES.items() if _layer(m)])
    assert not long, f"network modules over {NETWORK_MAX_LINES} lines: {long}"


def test_modules_stay_under_the_line_limit() -> None:
    long = _longer_than(MAX_LINES, list(MODULES.values()))
    assert not long, f"modules over {MAX_LINES} lines: {long}"


# -- the checks themselves catch what they should ---------------------------------------


def _fake(edges: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    return {m: dict.fromkeys(ts, 1) for m, ts in edges.items()}


def test_a_report_importing_sim_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MODULES, "clustersim.report.fake", PACKAGE / "report" / "fake.py")
    graph = _fake({"clustersim.report.fake": ["clustersim.sim.run", "clustersim.trace.io"]})
    broken = violations(graph, RULES)
    assert len(broken) == 1
    assert "report imports sim" in broken[0]


def test_a_fabric_importing_flows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    for layer in ("fabric", "flows"):
        fake = f"clustersim.network.{layer}.fake"
        monkeypatch.setitem(MODULES, fake, PACKAGE / "network" / layer / "fake.py")
    graph = _fake(
        {
            "clustersim.network.fabric.fake": [
                "clustersim.network.flows",
                "clustersim.network.fabric.links",
            ],
            "clustersim.network.flows.fake": ["clustersim.network.fabric"],
        }
    )
    broken = layer_violations(graph, LAYERS)
    assert len(broken) == 1
    assert "network.fabric imports network.flows" in broken[0]


def test_reaching_into_a_network_subpackage_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MODULES, "clustersim.sim.fake", PACKAGE / "sim" / "fake.py")
    graph = _fake(
        {
            "clustersim.sim.fake": [
                "clustersim.network.flows.flownetwork",
                "clustersim.network.flows",
                "clustersim.network",
                "clustersim.network.microbench",
            ]
        }
    )
    broken = outside_reaching_in(graph)
    assert len(broken) == 1
    assert "clustersim.network.flows.flownetwork" in broken[0]


def test_a_type_only_cycle_is_caught() -> None:
    graph = _fake({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]})
    assert cycles(graph) == [["a", "b", "c"]]


def test_lazy_and_type_only_imports_are_read(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from clustersim.sim.run import simulate\n"
        "def f():\n"
        "    import clustersim.cli\n"
        "    from clustersim import cost\n"
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    found = {t for t, _ in _imports("clustersim.report.m", path)}
    assert found == {"clustersim.sim.run", "clustersim.cli", "clustersim.cost"}


def test_rules_parse_as_written() -> None:
    rules = parse_rules(
        "<!-- import rules: begin -->\n- `a`, `b`: `c`\n- `d`: anything\n- `e`: nothing\n"
        "<!-- import rules: end -->"
    )
    assert rules == {"a": frozenset({"c"}), "b": frozenset({"c"}), "d": None, "e": frozenset()}
    assert RULES["report"] is not None
    assert "sim" not in RULES["report"]
    assert LAYERS["fabric"] == frozenset()
    assert LAYERS["core"] is None
