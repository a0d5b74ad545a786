"""Explicit chip and instance specs with round numbers, for oracle tests of the network."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clustersim.catalog.schema import ChipSpec, InstanceSpec

LINK_BPS = 100e9
LINK_LAT_S = 1e-6
EFA_BPS = 320e9
EFA_LAT_S = 16e-6
DMA_BPS = 1e12


def make_chip(link_efficiency: float = 1.0) -> ChipSpec:
    return ChipSpec.model_validate(
        {
            "name": "testchip",
            "vendor": "aws",
            "family": "trainium",
            "cores": 8,
            "lnc_default": 2,
            "lnc_options": (1, 2),
            "core": {
                "tensor_tflops": {"bf16": 80, "fp32": 20},
                "vector_tflops": 1,
                "scalar_tflops": 1,
            },
            "chip_tflops": {"bf16": 640, "fp32": 160},
            "hbm_bytes": 96e9,
            "hbm_bw_Bps": 2.9e12,
            "dma_bw_Bps": DMA_BPS,
            "chip_to_chip_bw_Bps": 4 * LINK_BPS,
            "power_w": 500,
            "calibration": {
                "tensor_efficiency": 1.0,
                "hbm_efficiency": 1.0,
                "link_efficiency": link_efficiency,
            },
            "sources": {},
        }
    )


def make_instance(
    topology: str = "torus2d",
    dims: tuple[int, ...] = (4, 4),
    chips: int = 16,
    lanes: int = 1,
    **fabric: Any,
) -> InstanceSpec:
    return InstanceSpec.model_validate(
        {
            "name": f"test-{topology}",
            "chip": "testchip",
            "chips": chips,
            "fabric": {
                "topology": topology,
                "dims": dims,
                "link_bw_Bps": LINK_BPS,
                "link_latency_s": LINK_LAT_S,
                "lanes": lanes,
                **fabric,
            },
            "efa": {"bandwidth_Bps": EFA_BPS, "latency_s": EFA_LAT_S},
            "prices_usd_per_hour": {"on_demand": 1.0},
            "sources": {},
        }
    )


class Specs:
    """The factories and their round numbers, handed to tests by the ``specs`` fixture."""

    link_Bps = LINK_BPS
    link_latency_s = LINK_LAT_S
    efa_Bps = EFA_BPS
    efa_latency_s = EFA_LAT_S
    dma_Bps = DMA_BPS
    chip: Callable[..., ChipSpec] = staticmethod(make_chip)
    instance: Callable[..., InstanceSpec] = staticmethod(make_instance)


@pytest.fixture
def specs() -> Specs:
    return Specs()
