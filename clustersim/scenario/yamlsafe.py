"""Safe YAML for scenarios and studies: the loader and its limits.

YAML is read with a safe loader that also rejects duplicate keys, merge keys and
the non-plain tags (``!!binary``, ``!!set``, ``!!python/...``). Hostile documents
are refused before they are built: at most ``MAX_YAML_BYTES`` of text,
``MAX_YAML_NODES`` values as written, ``MAX_YAML_EXPANDED`` values once aliases
are expanded (a "billion laughs" document is tiny as text and astronomically
large expanded) and ``MAX_YAML_DEPTH`` levels of nesting.
"""

from __future__ import annotations

from typing import Any, ClassVar

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from clustersim.errors import MISSING, ScenarioError

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_TOTAL_TEXT_CHARS",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_EXPANDED",
    "MAX_YAML_NODES",
    "parse_yaml",
]

MAX_YAML_BYTES = 4 * 2**20
MAX_YAML_NODES = 20_000
"""Values (scalars, sequences, mappings) in the document as written. A real scenario
has a few hundred; the limit keeps parsing well under a second."""
MAX_YAML_EXPANDED = 100_000
"""Values once every alias is expanded."""
MAX_YAML_DEPTH = 32
"""Nesting levels; a scenario needs six (``cluster.chip.core.tensor_tflops.bf16``)."""
MAX_INT_BITS = 1024
"""Integer literals beyond 2**1024 (the float range) are refused as they are read:
Python will not print ints of more than 4300 digits, which error messages must do."""
MAX_INT_DIGITS = 308
MAX_KEY_CHARS = 200
MAX_TEXT_CHARS = 4096
"""Longest string value outside ``description``, which may be any length."""
MAX_TOTAL_TEXT_CHARS = 2**20
"""All keys and strings outside ``description``, aliases expanded: this bounds the
cost of printing any value of the document in an error message."""
_FREE_TEXT = frozenset({"description"})


class _PyParser(Reader, Scanner, Parser):
    """The pure-Python parser, for a PyYAML built without libyaml."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)


try:  # libyaml's parser is much faster on large inputs; the composer stays ours
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover
    _Parser = _PyParser  # type: ignore[assignment,misc]


class _Loader(Composer, _Parser, SafeConstructor, Resolver):
    """Safe loader: limits on size and nesting, no duplicate or merge keys, plain tags only.

    The composer (ours, in Python) comes before the parser in the method order, so
    that libyaml only parses and every node is counted here.
    """

    yaml_constructors: ClassVar[dict[str | None, Any]] = dict(SafeConstructor.yaml_constructors)

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._nodes += 1
        self._depth += 1
        try:
            if self._nodes > MAX_YAML_NODES:
                self._refuse(f"more than {MAX_YAML_NODES:,} values")
            if self._depth > MAX_YAML_DEPTH:
                self._refuse(f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _refuse(self, problem: str) -> None:
        event: Any = self.peek_event()  # a yaml.events.Event, from libyaml or not
        raise ComposerError(None, None, problem, event.start_mark if event else None)

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return self.construct_document(node)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: Node) -> None:
    """Refuse documents whose aliases expand too far, nest too deep or refer to themselves.

    Iterative post-order walk with sizes memoised per node, so a "billion laughs"
    document costs time linear in its text, not in its expansion.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_YAML_EXPANDED:
                problem = (
                    f"aliases expand to more than {MAX_YAML_EXPANDED:,} values "
                    "(write the values out instead)"
                )
                raise ComposerError(None, None, problem, node.start_mark)
            if depth[key] > MAX_YAML_DEPTH:
                problem = f"aliases nest deeper than {MAX_YAML_DEPTH} levels"
                raise ComposerError(None, None, problem, node.start_mark)
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise ComposerError(None, None, "an alias refers to its own anchor", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node) if id(kid) not in size)


def _construct_mapping(loader: _Loader, node: MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        mark = key_node.start_mark
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise ConstructorError(
                None, None, "merge keys (<<) are not supported; write the keys out", mark
            )
        if not isinstance(key_node, ScalarNode):
            raise ConstructorError(None, None, "mapping keys must be scalars", mark)
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _construct_int(loader: _Loader, node: ScalarNode) -> int:
    value: int | None
    try:
        value = loader.construct_yaml_int(node)
    except ValueError:  # more decimal digits than Python converts (4300)
        value = None
    if value is None or value.bit_length() > MAX_INT_BITS:
        raise ConstructorError(
            None, None, f"integer too large (more than {MAX_INT_DIGITS} digits)", node.start_mark
        )
    return value


def _construct_timestamp(loader: _Loader, node: ScalarNode) -> str:
    # A date is just text in a scenario (``name: 2024-06-01``), not a datetime.
    text: str = loader.construct_scalar(node)
    return text


def _refuse_tag(loader: _Loader, node: Node) -> Any:
    tag = node.tag.replace("tag:yaml.org,2002:", "!!")
    raise ConstructorError(
        None, None, f"the tag {tag} is not allowed in a scenario", node.start_mark
    )


_Loader.yaml_constructors.update(
    {
        Resolver.DEFAULT_MAPPING_TAG: _construct_mapping,
        "tag:yaml.org,2002:int": _construct_int,
        "tag:yaml.org,2002:timestamp": _construct_timestamp,
        "tag:yaml.org,2002:binary": _refuse_tag,
        "tag:yaml.org,2002:set": _refuse_tag,
        "tag:yaml.org,2002:omap": _refuse_tag,
        "tag:yaml.org,2002:pairs": _refuse_tag,
        None: _refuse_tag,  # any other tag: !!python/object, !custom, ...
    }
)


def parse_yaml(text: str, source: str = "<scenario>") -> Any:
    """Parse YAML safely; every failure becomes a one-line ``ScenarioError``."""
    if len(text) > MAX_YAML_BYTES:
        raise ScenarioError(source, MISSING, f"larger than {MAX_YAML_BYTES // 2**20} MiB")
    try:
        loader = _Loader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = _one_line(exc.problem or exc.context or "invalid YAML")
        raise ScenarioError(source, MISSING, f"YAML error at {where}: {problem}") from None
    except ReaderError as exc:
        where = _position(text, exc.position)
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        problem = f"YAML error at {where}: character {char!r} is not allowed"
        raise ScenarioError(source, MISSING, problem) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, MISSING, f"YAML error: {_one_line(str(exc))}") from None
    except UnicodeEncodeError as exc:  # lone surrogates in text given as a str
        where = _position(text, exc.start)
        raise ScenarioError(source, MISSING, f"YAML error at {where}: invalid text") from None
    except RecursionError:
        raise ScenarioError(source, MISSING, "YAML nested too deeply") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset)
    column = offset - (text.rfind("\n", 0, offset) + 1)
    return f"line {line + 1}, column {column + 1}"
