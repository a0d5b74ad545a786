"""Shared Hypothesis strategies: valid scenarios and hostile mutations of them.

The bases are the TINY scenario of ``tests/scenario_texts.py`` and the shipped files in
``scenarios/``. Mutations work on two levels:

- the parsed tree (``tree_mutations``): delete, rename, retype or replace any key
  or value, with hostile numbers, unit typos, unicode, lists where mappings
  belong, deep nesting and long strings; the result is dumped back to YAML;
- the YAML text (``text_mutations``): tags, anchors and aliases, duplicate keys,
  control characters, binary garbage, truncation, and whole hostile documents
  (alias bombs, deep nesting, huge files) built from a small description so that
  Hypothesis never has to generate megabytes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from scenario_texts import TINY

ROOT = Path(__file__).resolve().parent.parent
SCENARIO_FILES = sorted((ROOT / "scenarios").glob("*.yaml"))

# The texts and trees of the bases. SMALL is TINY cut down so that a run takes
# about a tenth of a second: two layers, one microbatch, no trace, no report.
SMALL = (
    TINY.replace("layers: 4", "layers: 2").replace("global_batch_size: 32", "global_batch_size: 8")
    + "output: {trace: false, html: false}\n"
)
# A base is written elsewhere before it is run: its fabric file, relative to the
# scenario, is given whole.
BASE_TEXTS: dict[str, str] = {
    "tiny": TINY,
    **{
        p.stem: p.read_text().replace("fabric_file: fabrics/", f"fabric_file: {p.parent}/fabrics/")
        for p in SCENARIO_FILES
    },
}
BASES: dict[str, dict[str, Any]] = {name: yaml.safe_load(t) for name, t in BASE_TEXTS.items()}
SMALL_TREE: dict[str, Any] = yaml.safe_load(SMALL)

Path_ = tuple[str | int, ...]

# -- hostile scalars ------------------------------------------------------------------

# Numbers that no field accepts: the error must name exactly the key that holds them.
ALWAYS_INVALID_NUMBERS: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    10**31,
    -(10**31),
    10**300,
    1e31,
    1e308,
    -1e308,
    1e-300,
    5e-324,
    "1e308",
    "-1e-300",
    "1e400",
]

HOSTILE_NUMBERS: list[Any] = [
    *ALWAYS_INVALID_NUMBERS,
    0,
    -1,
    -0.0,
    0.5,
    1.5,
    -(2**63),
    2**63,
    2**64,
    10**30,
    1e30,
    True,
    False,
    None,
    "",
    " ",
    "0",
    "-1",
    "nan",
    "inf",
    "-Infinity",
    "0x10",
    "1_000",
    "١٢",  # Arabic-Indic digits
    "9" * 400,
]

UNIT_TYPOS: list[str] = [
    "96GiBB",
    "96 Gib",
    "96gib",
    "96GIB",
    "2.9TB/sec",
    "2.9 TBps/s",
    "200 Gbit",
    "30 fortnights",
    "1.5uss",
    "1..5GB",
    "1.5.5GB",
    "GB",
    "-5GB",
    "5 G B",
    "1e3XB",
    "1e",
    "e5",
    "+-3s",
    "96 GiB extra",
    "1" * 60 + "#",  # once a ReDoS in the unit regex
    "1" * 70,
    "667TFLOP",
    "500Ww",
    "∞GB",
]

NASTY_TEXT: list[str] = [
    "\u202eevil",  # right-to-left override
    "ze\u200bro",  # zero-width space
    "jo\u200din",  # zero-width joiner
    "\ufeffbom",
    "line\u2028sep",
    "para\u2029sep",
    "next\x85line",
    "nul\x00",
    "esc\x1b[31mred",
    "bell\x07",
    "tab\there",
    "cr\rlf\n",
    "multi\nline",
    "😀",
    "👨‍👩‍👧",
    "ﷺ",
    "e\u0301",
    "שלום",
    "مرحبا",
    "名前",
    "\\",
    "'",
    '"',
    ": ",
    "- x",
    "# not a comment",
    "&anchor",
    "*alias",
    "!!python/object:os.system",
    "%YAML",
    "{[",
    "trn2.48xlarge ",
    " trn2.48xlarge",
    "TRN2.48XLARGE",
    "llama3_8b",
]

_characters = st.characters(blacklist_categories=("Cs",))


@st.composite
def long_strings(draw: st.DrawFn) -> str:
    """Strings longer than any field allows, made by repetition (cheap to generate)."""
    unit = draw(st.sampled_from(["x", "é", "😀", "ab\u200b", "1"]))
    return unit * draw(st.sampled_from([201, 4097, 70_000]))


def hostile_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(HOSTILE_NUMBERS),
        st.sampled_from(UNIT_TYPOS),
        st.sampled_from(NASTY_TEXT),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(_characters, max_size=20),
        long_strings(),
    )


def hostile_values() -> st.SearchStrategy[Any]:
    """Scalars, and small lists and mappings of them (mappings with hostile keys too)."""
    keys = st.one_of(
        st.text(_characters, min_size=0, max_size=10),
        st.sampled_from(NASTY_TEXT),
        st.integers(-5, 5),
        st.none(),
        st.booleans(),
    )
    return st.recursive(
        hostile_scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(keys, inner, max_size=4),
        ),
        max_leaves=8,
    )


# Values only the Python API can pass (``resolve(mapping)``), never YAML.
PYTHON_ONLY: list[Any] = [
    b"bytes",
    bytearray(b"ba"),
    (1, 2),
    {1, 2},
    frozenset(),
    complex(1, 2),
    Decimal("1e400"),
    Decimal("NaN"),
    Decimal("-0"),
    Fraction(1, 3),
    object(),
    range(3),
    type,
    print,
    Path("/etc/passwd"),
    float,
    Ellipsis,
    NotImplemented,
]


def nested(depth: int, leaf: Any = 1, kind: str = "list") -> Any:
    """``leaf`` wrapped ``depth`` times in one-element lists or mappings."""
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


# -- tree mutations ---------------------------------------------------------------------


def paths(tree: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every key path in ``tree`` (mappings and lists), parents before children."""
    out: list[Path_] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.append((*prefix, key))
            out.extend(paths(value, (*prefix, key)))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out.append((*prefix, i))
            out.extend(paths(value, (*prefix, i)))
    return out


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def get(tree: Any, path: Path_) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def _parent(tree: Any, path: Path_) -> tuple[Any, str | int]:
    return get(tree, path[:-1]), path[-1]


@dataclass(frozen=True)
class Mutation:
    """One change to a tree; ``describe`` is shown when Hypothesis reports a failure."""

    op: str
    path: Path_
    value: Any = None

    def apply(self, tree: Any) -> Any:
        if self.op == "add" and isinstance(get(tree, self.path), dict):
            get(tree, self.path)[self.value[0]] = self.value[1]
            return tree
        if not self.path:
            return self.value if self.op == "replace" else tree
        parent, key = _parent(tree, self.path)
        if self.op == "delete":
            del parent[key]
        elif self.op == "replace":
            parent[key] = self.value
        elif self.op == "wrap":  # a list where a mapping or scalar belongs
            parent[key] = [parent[key]]
        elif self.op == "rename" and isinstance(parent, dict):
            parent[self.value] = parent.pop(key)
        return tree


# Built once: Hypothesis validates a strategy the first time it draws from it, and
# validating these recursive ones on every example cost more than running the case.
HOSTILE_SCALARS = hostile_scalars()
HOSTILE_VALUES = hostile_values()
_DEEP = st.builds(
    nested,
    st.sampled_from([5, 20, 31, 40, 200]),
    HOSTILE_SCALARS,
    st.sampled_from(["list", "dict"]),
)
_NEW_KEYS = st.one_of(
    st.sampled_from(NASTY_TEXT),
    st.text(_characters, min_size=1, max_size=12),
    st.integers(-3, 3),
    st.none(),
    st.booleans(),
)
_OPS = ["delete", "replace", "number", "unit", "deep", "wrap", "rename", "typo", "add", "root"]


@st.composite
def mutations(draw: st.DrawFn, tree: dict[str, Any]) -> Mutation:
    """One hostile change to ``tree``: which kind, where, and with what."""
    all_paths = paths(tree)
    op = draw(st.sampled_from(_OPS))
    if op == "add":
        mappings = [(), *(p for p in all_paths if isinstance(get(tree, p), dict))]
        where = draw(st.sampled_from(mappings))
        return Mutation("add", where, (draw(_NEW_KEYS), draw(HOSTILE_VALUES)))
    if op == "root":  # the whole document
        return Mutation("replace", (), draw(HOSTILE_VALUES))
    where = draw(st.sampled_from(all_paths))
    values: dict[str, st.SearchStrategy[Any]] = {
        "replace": HOSTILE_VALUES,
        "number": st.sampled_from(HOSTILE_NUMBERS),
        "unit": st.sampled_from(UNIT_TYPOS),
        "deep": _DEEP,
        "rename": _NEW_KEYS,
        "typo": st.sampled_from([f"{where[-1]}x", str(where[-1]).upper(), f" {where[-1]}"]),
    }
    if op in values:
        kind = "rename" if op in ("rename", "typo") else "replace"
        return Mutation(kind, where, draw(values[op]))
    return Mutation(op, where)


@st.composite
def tree_mutations(
    draw: st.DrawFn, bases: dict[str, dict[str, Any]] | None = None, max_mutations: int = 3
) -> tuple[str, Any, list[Mutation]]:
    """(base name, mutated tree, mutations): one to ``max_mutations`` hostile changes."""
    bases = bases or BASES
    name = draw(st.sampled_from(sorted(bases)))
    tree = copy.deepcopy(bases[name])
    done: list[Mutation] = []
    for _ in range(draw(st.integers(1, max_mutations))):
        if not isinstance(tree, dict) or not tree:
            break
        mutation = draw(mutations(tree))
        tree = mutation.apply(tree)
        done.append(mutation)
    return name, tree, done


@st.composite
def python_trees(draw: st.DrawFn) -> tuple[str, Any, list[Mutation]]:
    """``tree_mutations`` plus, half the time, a value YAML cannot produce."""
    name, tree, done = draw(tree_mutations())
    if isinstance(tree, dict) and tree and draw(st.booleans()):
        where = draw(st.sampled_from(paths(tree)))
        mutation = Mutation("replace", where, draw(st.sampled_from(PYTHON_ONLY)))
        tree = mutation.apply(tree)
        done.append(mutation)
    return name, tree, done


@st.composite
def number_mutations(draw: st.DrawFn) -> tuple[str, Any, Path_, Any]:
    """A valid base with one value (any depth, mappings included) replaced by a number
    that no field accepts. Returns (base, tree, path, value)."""
    name = draw(st.sampled_from(sorted(BASES)))
    tree = copy.deepcopy(BASES[name])
    value = draw(st.sampled_from(ALWAYS_INVALID_NUMBERS))
    # "1e308" as text is fine in a description, which may say anything
    where = [p for p in paths(tree) if not (isinstance(value, str) and p[0] == "description")]
    path = draw(st.sampled_from(where))
    return name, Mutation("replace", path, value).apply(tree), path, value


def dump(tree: Any) -> str:
    """YAML text of ``tree``: unicode kept, NaN and infinities as .nan and .inf."""
    return yaml.safe_dump(tree, allow_unicode=True, sort_keys=False, width=10**6)


# -- --set overrides ------------------------------------------------------------------

SET_KEYS = [
    *sorted({dotted(p) for tree in BASES.values() for p in paths(tree)}),
    "cluster.chip.hbm_bytes",
    "cluster.chip.hbm_bw_Bps",
    "cluster.chip.core.tensor_tflops.bf16",
    "cluster.chip.calibration.tensor_efficiency",
    "cluster.chip.calibration.matmul_latency_s",
    "cluster.neuronlink.link_bw_Bps",
    "cluster.neuronlink.link_latency_s",
    "cluster.neuronlink.lanes",
    "cluster.efa.latency_s",
    "cluster.efa.nics",
    "cluster.prices_usd_per_hour.on_demand",
    "cluster.collectives.all_reduce",
    "cost.usd_per_instance_hour",
    "parallelism.grad_bucket_bytes",
    "model.max_seq_len",
    "output.dir",
    "nope",
    "cluster.nope.deeper",
    "model.name.x",
]


@st.composite
def set_overrides(draw: st.DrawFn) -> list[str]:
    """One to three ``--set key=value`` arguments, hostile in key, value or syntax."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(
            st.one_of(
                st.sampled_from(SET_KEYS),
                st.sampled_from(["", ".", "a..b", "=", "cluster.", ".cluster", " ", "a=b"]),
                st.text(_characters, max_size=12),
                st.integers(1, 60).map(lambda n: "cluster.chip." + "a." * n + "b"),
                st.sampled_from(["x" * 300, "cluster.chip." + "k" * 300]),
            )
        )
        value = draw(
            st.one_of(
                st.sampled_from(HOSTILE_NUMBERS).map(lambda v: dump(v).removesuffix("\n...\n")),
                st.sampled_from(UNIT_TYPOS),
                st.sampled_from(NASTY_TEXT),
                st.sampled_from(["[", "{a: 1", "!!python/object:os.system x", "&a [*a]", "*x"]),
                st.sampled_from(["{a: &a [1,1,1], b: [*a,*a,*a]}", "[" * 40 + "]" * 40]),
                st.text(_characters, max_size=20),
            )
        )
        out.append(f"{key}={value}" if draw(st.booleans()) or not key else key)
    return out


# -- small valid variants ---------------------------------------------------------------


@st.composite
def small_valid_variants(draw: st.DrawFn) -> dict[str, Any]:
    """SMALL with its sizes redrawn from small ranges: mostly valid, always quick to run."""
    tree = copy.deepcopy(SMALL_TREE)
    par, train, model = tree["parallelism"], tree["training"], tree["model"]
    par["tp"] = draw(st.sampled_from([1, 2, 4, 8]))
    par["pp"] = draw(st.sampled_from([1, 2]))
    par["zero"] = draw(st.sampled_from([0, 1]))
    par["schedule"] = draw(st.sampled_from(["1f1b", "gpipe"]))
    par["recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
    par["microbatch_size"] = draw(st.sampled_from([1, 2]))
    model["layers"] = draw(st.sampled_from([2, 4]))
    train["seq_len"] = draw(st.sampled_from([128, 512, 1024]))
    train["global_batch_size"] = draw(st.sampled_from([8, 16]))
    train["precision"] = draw(st.sampled_from(["bf16", "fp16", "fp8"]))
    train["steps"] = draw(st.sampled_from([1, 2]))
    return tree


# -- text mutations ---------------------------------------------------------------------

SNIPPETS: list[str] = [
    "x: !!python/object/apply:os.system ['echo pwned']\n",
    "x: !!python/name:os.system\n",
    "x: !!binary aGVsbG8=\n",
    "x: !!set {a, b}\n",
    "x: !custom 1\n",
    "x: !!timestamp 2001-12-14\n",
    "<<: {seed: 1}\n",
    "x: &a [1, 2]\ny: *a\n",
    "y: *undefined\n",
    "x: &a [*a]\n",
    "name: duplicate\n",
    "seed: 0\nseed: 1\n",
    "? [a, b]\n: 1\n",
    "? {a: b}\n: 1\n",
    "1: one\n",
    "null: nothing\n",
    ".nan: nan-key\n",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "\t\tx: tab-indented\n",
    "   x: 1\n",
    "x: 1\x00\n",
    "x: \x07\x1b\x7f\n",
    "x: \u2028\n",
    "x: \x85\n",
    "x: \ud7ff\ue000\n",
    "x: '\\ud800'\n",
    'x: "\\ud800"\n',
    'x: "\\x00\\u202e"\n',
    "x: " + "9" * 5000 + "\n",
    "x: 0x" + "f" * 3000 + "\n",
    "x: 0b" + "1" * 5000 + "\n",
    "x: 1:2:3:4:5:6:7:8:9\n",
    "x: 1e99999\n",
    "x: -.inf\n",
    "x: [" + "[" * 100 + "\n",
    "x: " + "{a: " * 50 + "1" + "}" * 50 + "\n",
    "- a\n",
    "x: |\n  multi\n  line\n",
    "x: >-\n  folded\n",
    "x: 'unterminated\n",
    '"key\\nwith newline": 1\n',
    "'😀\u202e': 1\n",
]


@dataclass(frozen=True)
class Bomb:
    """A hostile document described in a few numbers, built only when needed."""

    kind: str
    size: int

    def build(self) -> str:
        return _BOMB_BUILDERS[self.kind](self.size)


def _laughs(n: int) -> str:
    """n levels of 9 aliases each: 9**n values once expanded."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, n + 1):
        refs = ", ".join([f"*l{i - 1}"] * 9)
        lines.append(f"l{i}: &l{i} [{refs}]")
    return "\n".join(lines) + f"\nname: *l{n}\n"


def _laughs_in_override(n: int) -> str:
    """3**n values under ``cluster.chip``, a free-form mapping merged into the catalog."""
    lines = ["a0: &a0 {x: 1, y: 1, z: 1}"]
    for i in range(1, n + 1):
        lines.append(f"a{i}: &a{i} {{x: *a{i - 1}, y: *a{i - 1}, z: *a{i - 1}}}")
    body = "\n".join("    " + line for line in lines)
    return TINY.replace(
        "cluster: {instance: trn2.48xlarge, count: 1}",
        f"cluster:\n  instance: trn2.48xlarge\n  chip:\n{body}\n    top: *a{n}",
    )


def _block_depth(n: int) -> str:
    return "".join(" " * i + "a:\n" for i in range(n)) + " " * n + "b: 1\n"


_BOMB_BUILDERS: dict[str, Callable[[int], str]] = {
    "laughs": _laughs,
    "laughs-in-override": _laughs_in_override,
    "flow-depth": lambda n: "name: " + "[" * n + "]" * n + "\n",
    "map-depth": lambda n: "name: " + "{a: " * n + "1" + "}" * n + "\n",
    # Indentation grows as n**2 / 2 bytes: 100,000 levels would be a 5 GB file. Past
    # 3,000 levels (4.5 MB) the file is refused for its size anyway.
    "block-depth": lambda n: _block_depth(min(n, 3000)),
    "dash-depth": lambda n: "- " * n + "x\n",
    "wide-list": lambda n: "name: [" + "1," * n + "1]\n",
    "many-keys": lambda n: "".join(f"k{i}: {i}\n" for i in range(n)),
    "many-aliases": lambda n: "a: &a x\nb: [" + ", ".join(["*a"] * n) + "]\n",
    "long-string": lambda n: TINY.replace("name: tiny", "name: " + "x" * n),
    "long-description": lambda n: TINY + "description: " + "y" * n + "\n",
}


BOMBS = st.one_of(
    st.builds(Bomb, st.just("laughs"), st.integers(1, 12)),
    st.builds(Bomb, st.just("laughs-in-override"), st.integers(1, 14)),
    st.builds(
        Bomb,
        st.sampled_from(["flow-depth", "map-depth", "block-depth", "dash-depth"]),
        st.sampled_from([10, 31, 33, 100, 999, 1001, 5000, 100_000]),
    ),
    st.builds(
        Bomb,
        st.sampled_from(["wide-list", "many-keys", "many-aliases"]),
        st.sampled_from([100, 19_999, 20_001, 200_000]),
    ),
    st.builds(
        Bomb,
        st.sampled_from(["long-string", "long-description"]),
        st.sampled_from([4096, 100_000, 4 * 2**20 - 200, 4 * 2**20 + 1]),
    ),
)


@st.composite
def text_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    """(description, file content): a base text damaged at the text or byte level."""
    name = draw(st.sampled_from(sorted(BASE_TEXTS)))
    text = BASE_TEXTS[name]
    lines = text.splitlines(keepends=True)
    kinds = ["snippet", "snippet-indented", "char", "truncate", "bytes", "garbage", "bomb", "dup"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("snippet", "snippet-indented"):
        at = draw(st.integers(0, len(lines)))
        snippet = draw(st.sampled_from(SNIPPETS))
        if kind == "snippet-indented":
            snippet = "".join("  " + line for line in snippet.splitlines(keepends=True))
        lines.insert(at, snippet)
        what, content = f"{kind} at line {at}", "".join(lines)
    elif kind == "char":
        at = draw(st.integers(0, len(text)))
        char = draw(st.one_of(st.sampled_from(NASTY_TEXT), st.text(_characters, min_size=1)))
        what, content = f"insert {char!r} at {at}", text[:at] + char + text[at:]
    elif kind == "truncate":
        at = draw(st.integers(0, len(text)))
        what, content = f"truncated at {at}", text[:at]
    elif kind == "bytes":
        data = bytearray(text.encode())
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
        what, content = f"byte {at} set", bytes(data)
    elif kind == "garbage":
        prefix = draw(st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"name: "]))
        what, content = "garbage", prefix + draw(st.binary(max_size=200))
    elif kind == "dup":
        at = draw(st.integers(0, len(lines) - 1))
        lines.insert(at, lines[at])
        what, content = f"line {at} twice", "".join(lines)
    else:
        bomb = draw(BOMBS)
        what, content = f"{bomb}", bomb.build()
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    return f"{name}: {what}", content
