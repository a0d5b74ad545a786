"""What the per-engine kernel builders share (:mod:`.moe_kernels_build`,
:mod:`.decode_kernels_build`): one ``<prefix>-<chip>.npz`` per chip from each serving
engine's table in aiconfigurator-core's data (``trtllm``: the version of the chip's
default GEMM file; ``vllm``: the version of its ``-vllm`` file), the Markdown that
says where each file's lanes come from, and the command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from clustersim.hardware.kernels_build import CHIPS, OUT, _read, write_npz

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["build_engine_files", "build_main", "sources_md"]

Arrays = dict[str, NDArray[np.generic]]


def sources_md(
    report: dict[str, Arrays],
    *,
    title: str,
    table: str,
    module: str,
    reader: str,
    shape: Callable[[Arrays, str], str],
) -> str:
    """A ``*_SOURCES.md``: the wheel, the table, how to rebuild, and each file's lanes
    (``shape(arrays, lane)`` says how much a lane holds)."""
    lines = [
        f"# {title}",
        "",
        "Derived from NVIDIA's `aiconfigurator-core` 0.12.0 wheel (Apache-2.0, NVIDIA): its",
        f"`aiconfigurator_core/systems/data/<system>/{table}`.",
        "Regenerate (same bytes every run):",
        "",
        "```",
        "pip download --no-deps aiconfigurator-core==0.12.0",
        "unzip aiconfigurator_core-*.whl -d aic",
        f"python -m {module} \\",
        "    --data aic/aiconfigurator_core/systems/data",
        "```",
        "",
        f"`{module}` says what each file holds and why these",
        f"kernels; `{reader}` how the simulator reads them.",
    ]
    for stem, arrays in report.items():
        chip = stem.split("-", 1)[1]
        lines += ["", f"## {stem} (`{CHIPS[chip].folder}`)", ""]
        for name in sorted(arrays):
            if name.endswith(".source"):
                lane = name.removesuffix(".source")
                lines.append(f"- {lane}: {shape(arrays, lane)}; `{arrays[name]}`")
    return "\n".join(lines) + "\n"


def build_engine_files(
    data: Path,
    out: Path,
    chips: Sequence[str],
    *,
    prefix: str,
    table: tuple[str, str],
    arrays_of: Callable[[pd.DataFrame, str], Arrays],
) -> dict[str, Arrays]:
    """Write ``<prefix>-<chip>.npz`` for each chip where an engine measured ``table``
    (its folder under ``<system>/`` and its file name), its lanes ``arrays_of(frame,
    engine)``; each file's stem and arrays, in chip order."""
    folder, name = table
    written: dict[str, Arrays] = {}
    for chip in chips:
        src = CHIPS[chip]
        arrays: Arrays = {}
        for engine, version in (("trtllm", src.version), ("vllm", src.vllm)):
            path = data / src.folder / folder / engine / str(version) / name
            if version is None or not path.is_file():
                continue
            arrays.update(arrays_of(_read(path), engine))
        if arrays:
            target = out / f"{prefix}-{chip}.npz"
            write_npz(target, arrays)
            written[target.stem] = arrays
    return written


def build_main(
    prog: str, build: Callable[[Path, Path], list[Path]], argv: Sequence[str] | None
) -> int:
    """``python -m PROG --data DIR [--out DIR]``: run ``build`` and list what it wrote."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("--data", type=Path, required=True, help="the wheel's systems/data")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    for path in build(args.data, args.out):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0
