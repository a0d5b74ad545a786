"""The shipped catalogs: every entry validates, every figure names its source, spot values.

The source check walks each entry's raw YAML mapping, so a figure added without a
``sources`` line fails here rather than slipping into results unexplained.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from clustersim import catalog
from clustersim.catalog import KINDS, Kind, entries
from clustersim.catalog.schema import ChipSpec, InstanceSpec, ModelSpec
from clustersim.errors import CatalogError

UNCONFIRMED = " (unconfirmed; override in the scenario)"
DEFAULT = "default:"

# A number followed by an optional unit, as clustersim.units reads it ("96GiB", "1.5us").
_QUANTITY = re.compile(r"^\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*[A-Za-z/%]*\s*$")

ALL_ENTRIES = [(kind, name) for kind in KINDS for name in catalog.names(kind)]


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and _QUANTITY.match(value) is not None


def numeric_leaves(data: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of every numeric figure; a list of numbers is one figure at the list's path."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key == "sources" and not prefix:
            continue
        if isinstance(value, dict):
            yield from numeric_leaves(value, f"{path}.")
        elif isinstance(value, list):
            if any(_is_number(item) for item in value):
                yield path
        elif _is_number(value):
            yield path


def covered(path: str, sources: dict[str, str]) -> bool:
    """True if ``path`` or one of its dotted prefixes has a source."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in sources for i in range(1, len(parts) + 1))


def resolves(path: str, data: dict[str, Any]) -> bool:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _sources(kind: Kind, name: str) -> dict[str, str]:
    sources = entries(kind)[name].get("sources")
    assert isinstance(sources, dict), f"{kind}.{name}: missing sources mapping"
    return sources


# --- every entry ------------------------------------------------------------------------


def test_catalogs_hold_the_required_entries() -> None:
    assert set(catalog.names("chips")) >= {"trn1", "trn2", "trn3", "a100", "h100", "h200", "b200"}
    assert set(catalog.names("instances")) >= {
        "trn1.32xlarge",
        "trn1n.32xlarge",
        "trn2.48xlarge",
        "trn2u.48xlarge",
        "trn3-ultraserver-node",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
        "dgx-a100",
        "p5-roce",
    }
    assert set(catalog.names("models")) >= {
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "llama2-7b",
        "gpt3-175b",
        "megatron-1.7b",
        "megatron-7.5b",
        "megatron-39.1b",
        "megatron-145.6b",
        "megatron-1008b",
        "mixtral-8x7b",
        "mixtral-8x22b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
    }


@pytest.mark.parametrize(("kind", "name"), ALL_ENTRIES)
def test_entry_validates(kind: Kind, name: str) -> None:
    loaders: dict[str, Callable[[str], ChipSpec | InstanceSpec | ModelSpec]] = {
        "chips": catalog.chip,
        "instances": catalog.instance,
        "models": catalog.model,
    }
    spec = loaders[kind](name)
    assert spec.name == name


@pytest.mark.parametrize(("kind", "name"), ALL_ENTRIES)
def test_every_numeric_figure_has_a_source(kind: Kind, name: str) -> None:
    raw = entries(kind)[name]
    sources = _sources(kind, name)
    missing = [path for path in numeric_leaves(raw) if not covered(path, sources)]
    assert not missing, f"{kind}.{name}: figures without a source: {missing}"


@pytest.mark.parametrize(("kind", "name"), ALL_ENTRIES)
def test_sources_name_real_fields(kind: Kind, name: str) -> None:
    raw = entries(kind)[name]
    stale = [key for key in _sources(kind, name) if not resolves(key, raw)]
    assert not stale, f"{kind}.{name}: sources for fields that do not exist: {stale}"


@pytest.mark.parametrize(("kind", "name"), ALL_ENTRIES)
def test_sources_follow_the_conventions(kind: Kind, name: str) -> None:
    for key, text in _sources(kind, name).items():
        where = f"{kind}.{name}.sources.{key}"
        assert isinstance(text, str), where
        assert text.strip(), where
        if "unconfirmed" in text:
            assert text.endswith(UNCONFIRMED), f"{where}: unconfirmed marker must end the source"
        if text.startswith(DEFAULT):
            # A default explains itself in a sentence, not just the word.
            assert len(text) > len(DEFAULT) + 15, f"{where}: default without a rationale"


def test_numeric_leaves_walks_nested_fields_and_lists() -> None:
    raw = {
        "cores": 8,
        "flag": True,
        "name": "trn2",
        "core": {"tensor_tflops": {"bf16": 79}, "sbuf_bytes": "24MiB"},
        "calibration": {"tile": [128, 128]},
        "fabric": {"topology": "torus2d", "dims": [4, 4]},
        "sources": {"cores": "x"},
    }
    assert sorted(numeric_leaves(raw)) == [
        "calibration.tile",
        "core.sbuf_bytes",
        "core.tensor_tflops.bf16",
        "cores",
        "fabric.dims",
    ]
    assert covered("core.tensor_tflops.bf16", {"core.tensor_tflops": "x"})
    assert not covered("core.tensor_tflops.bf16", {"core.tensor": "x"})


# --- unknown names --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loader", "kind", "bad"),
    [
        (catalog.chip, "chips", "trn9"),
        (catalog.instance, "instances", "trn2.96xlarge"),
        (catalog.model, "models", "llama5-1t"),
    ],
)
def test_unknown_name_raises_catalog_error_listing_valid_names(
    loader: Callable[[str], object], kind: Kind, bad: str
) -> None:
    with pytest.raises(CatalogError) as info:
        loader(bad)
    message = str(info.value)
    assert bad in message
    for valid in catalog.names(kind):
        assert valid in message


def test_unknown_name_suggests_the_closest() -> None:
    with pytest.raises(CatalogError, match="did you mean 'trn2'"):
        catalog.chip("trn22")


# --- spot values -------------------------------------------------------------------------


def test_trn2_chip() -> None:
    trn2 = catalog.chip("trn2")
    assert trn2.chip_tflops.bf16 * 1e12 == pytest.approx(667e12)
    assert trn2.chip_tflops.get("fp8") == pytest.approx(1299)
    assert trn2.core.tensor_tflops.bf16 == pytest.approx(79)
    assert trn2.hbm_bytes == 96 * 2**30
    assert trn2.hbm_bw_Bps == pytest.approx(2.9e12)
    assert trn2.core.sbuf_bytes == 28 * 2**20
    assert (trn2.cores, trn2.lnc_default, trn2.lnc_options) == (8, 2, (1, 2))
    assert trn2.calibration.tile == (128, 128)
    assert trn2.calibration.matmul_latency_s == pytest.approx(2e-6)


def test_gpu_chips() -> None:
    h100 = catalog.chip("h100")
    assert h100.hbm_bw_Bps == pytest.approx(3.35e12)
    assert h100.chip_tflops.bf16 == pytest.approx(989)
    assert h100.chip_tflops.get("fp8") == pytest.approx(1979)
    assert (h100.cores, h100.lnc_default) == (1, 1)
    assert h100.core.gpsimd_tflops == 0
    # A100 has no FP8 tensor path: the peak falls back to BF16.
    assert catalog.chip("a100").chip_tflops.get("fp8") == pytest.approx(312)
    assert catalog.chip("b200").hbm_bytes == pytest.approx(180e9)


def test_trainium_core_peaks_stay_within_chip_peaks() -> None:
    # The per-core figures sum to at most the chip total, up to their rounding
    # (Trn3 FP8: 8 x 315 = 2,520 against 2,517).
    for name in ("trn1", "trn2", "trn3"):
        chip = catalog.chip(name)
        for precision in ("bf16", "fp8", "fp32"):
            per_cores = chip.cores * chip.core.tensor_tflops.get(precision)
            assert per_cores <= chip.chip_tflops.get(precision) * 1.005, (name, precision)


def test_instance_spot_values() -> None:
    trn2 = catalog.instance("trn2.48xlarge")
    assert (trn2.chip, trn2.chips, trn2.fabric.topology, trn2.fabric.dims) == (
        "trn2",
        16,
        "torus2d",
        (4, 4),
    )
    assert trn2.fabric.link_bw_Bps == pytest.approx(128e9)
    assert trn2.efa.bandwidth_Bps == pytest.approx(3.2e12 / 8)
    assert trn2.efa.latency_s == pytest.approx(15e-6)
    trn1 = catalog.instance("trn1.32xlarge")
    assert trn1.prices_usd_per_hour.on_demand == pytest.approx(21.50)
    assert trn1.prices_usd_per_hour.reserved == pytest.approx(8.197)
    ultra = catalog.instance("trn2u.48xlarge").ultraserver
    assert ultra is not None
    assert (ultra.instances, ultra.topology) == (4, "torus3d")
    assert catalog.instance("dgx-a100").efa.bandwidth_Bps == pytest.approx(8 * 200e9 / 8)


@pytest.mark.parametrize("name", catalog.names("instances"))
def test_instance_chip_exists_and_fabric_fits(name: str) -> None:
    spec = catalog.instance(name)
    assert spec.chip in catalog.names("chips")
    if spec.fabric.dims:
        assert math.prod(spec.fabric.dims) == spec.chips


# Chip bandwidth on ports that an instance leaves unconnected: a trn2.48xlarge outside an
# UltraServer does not use the 256 GB/s of Z links that join instances, nor a one-chip
# inf2 instance its NeuronLink.
UNUSED_PORTS_BPS = {"trn2.48xlarge": 256e9, "inf2.xlarge": 192e9, "inf2.8xlarge": 192e9}


@pytest.mark.parametrize("name", catalog.names("instances"))
def test_link_bandwidths_add_up_to_the_chip_bandwidth(name: str) -> None:
    """Per-link, per-direction figures times links and directions give the chip's total."""
    spec = catalog.instance(name)
    chip = catalog.chip(spec.chip)
    # A torus chip has two neighbours per dimension; a switch chip has one link into the switch.
    # A dimension of size 1 has no neighbours (inf2's ring is a torus of [chips, 1]).
    ring_dims = sum(1 for d in spec.fabric.dims if d > 1)
    links = 2 * ring_dims if spec.fabric.topology == "torus2d" else 1
    total = links * 2 * spec.fabric.link_bw_Bps
    if spec.ultraserver is not None and spec.ultraserver.topology == "torus3d":
        total += 2 * 2 * spec.ultraserver.link_bw_Bps  # Z ring: two neighbours
    total += UNUSED_PORTS_BPS.get(name, 0.0)
    assert total == pytest.approx(chip.chip_to_chip_bw_Bps)


# --- models ------------------------------------------------------------------------------


def parameter_count(m: ModelSpec) -> float:
    """Weights of a decoder-only transformer (norms and biases ignored)."""
    h, hd = m.hidden, m.head_dim
    attention = 2 * h * m.heads * hd + 2 * h * m.kv_heads * hd

    def mlp(width: int) -> int:
        return (3 if m.activation == "swiglu" else 2) * h * width

    if m.moe is None:
        body = m.layers * (attention + mlp(m.ffn_hidden))
    else:
        e = m.moe
        dense = e.dense_layers * (attention + mlp(m.ffn_hidden))
        experts = (e.experts + e.shared_experts) * mlp(e.expert_ffn_hidden) + h * e.experts
        body = dense + (m.layers - e.dense_layers) * (attention + experts)
    embedding = m.vocab * h * (1 if m.tied_embeddings else 2)
    if m.position == "learned":
        embedding += m.max_seq_len * h
    return float(body + embedding)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.6e9),
        ("llama3-405b", 405e9),
        ("llama2-7b", 6.74e9),
        ("gpt3-175b", 175e9),
        ("megatron-1.7b", 1.7e9),
        ("megatron-7.5b", 7.5e9),
        ("megatron-39.1b", 39.1e9),
        ("megatron-145.6b", 145.6e9),
        ("megatron-1008b", 1008e9),
        ("mixtral-8x7b", 46.7e9),
        ("mixtral-8x22b", 141e9),
        ("qwen3-30b-a3b", 30.5e9),
        ("qwen3-235b-a22b", 235e9),
    ],
)
def test_model_shapes_give_the_published_parameter_count(name: str, published: float) -> None:
    assert parameter_count(catalog.model(name)) == pytest.approx(published, rel=0.03)


def test_model_spot_values() -> None:
    m = catalog.model("llama3-70b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (80, 8192, 64, 8, 128)
    moe = catalog.model("deepseek-v3").moe
    assert moe is not None
    assert (moe.experts, moe.top_k, moe.shared_experts, moe.dense_layers) == (256, 8, 1, 3)
    gpt = catalog.model("megatron-1008b")
    assert (gpt.activation, gpt.position, gpt.ffn_hidden) == ("gelu", "learned", 4 * 25600)
