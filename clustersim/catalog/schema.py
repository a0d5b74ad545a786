"""Pydantic models of the catalog entries: chips and instances (models are
:mod:`clustersim.catalog.model_schema`'s, importable from here too).

Catalog YAML files (``chips.yaml``, ``instances.yaml``, ``models.yaml``) hold
one mapping per entry, keyed by name. Quantities may be unit strings; they are
parsed into SI floats here. Every entry carries ``sources``: a mapping from
field name (dotted for nested fields) to where the figure comes from. Figures
that are defaults rather than published numbers say so in their source.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from clustersim import units
from clustersim.catalog._strict import Strict
from clustersim.catalog.model_schema import MLASpec, ModelSpec, MoESpec

__all__ = [
    "Bandwidth",
    "Bytes",
    "Calibration",
    "ChipSpec",
    "CollectiveCosts",
    "CoreSpec",
    "Duration",
    "EfaSpec",
    "EnginesSpec",
    "FabricSpec",
    "InstanceSpec",
    "MLASpec",
    "MemoryOverride",
    "MoESpec",
    "ModelSpec",
    "OwnedCost",
    "Power",
    "Prices",
    "Strict",
    "UltraServerSpec",
]


def _unit(parser: units.Parser) -> BeforeValidator:
    def convert(value: object) -> object:
        # Leave non-quantities to pydantic so that its type errors are reported.
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            try:
                return parser(value)
            except units.UnitError as exc:
                raise ValueError(str(exc)) from None
        return value

    return BeforeValidator(convert)


Bytes = Annotated[float, _unit(units.parse_bytes)]
Bandwidth = Annotated[float, _unit(units.parse_bandwidth)]
LinkRate = Annotated[float, _unit(units.parse_bandwidth), Field(gt=0)]
"""A bandwidth that carries traffic: zero would stall every transfer on it."""
PositiveInt = Annotated[int, Field(ge=1, le=1_000_000)]
Duration = Annotated[float, _unit(units.parse_duration)]
Power = Annotated[float, _unit(units.parse_power)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


Precision = Literal["bf16", "fp16", "fp8", "fp32", "tf32"]


class TensorPeaks(Strict):
    """Dense tensor-engine peak in TFLOP/s, per precision."""

    bf16: Positive
    fp8: Positive | None = None
    fp32: Positive

    def get(self, precision: str) -> float:
        if precision in ("bf16", "fp16", "tf32"):
            return self.bf16
        if precision == "fp8":
            return self.fp8 if self.fp8 is not None else self.bf16
        return self.fp32


class CoreSpec(Strict):
    """One NeuronCore (or, for a GPU, the whole GPU seen as one core).

    Engine rates are per core. Vector, scalar and GPSIMD rates are element
    operations per second at FP32, given in TFLOP/s like the tensor rates.
    """

    tensor_tflops: TensorPeaks
    vector_tflops: Positive
    scalar_tflops: Positive
    gpsimd_tflops: float = Field(ge=0, default=0.0)
    sbuf_bytes: Bytes = 0.0
    psum_bytes: Bytes = 0.0


class Calibration(Strict):
    """Efficiency constants, set once per chip family and documented in ``sources``.

    - ``tensor_efficiency``: fraction of the tensor peak a large, tile-aligned matmul sustains.
    - ``fp8_tensor_efficiency``: the same for FP8 matmuls against the FP8 peak (their
      scaling and accumulation cost more of it); ``tensor_efficiency`` when not set.
    - ``attention_efficiency``: the same for a fused flash-attention core's matmuls (at
      its precision's peak, BF16 under an FP8 recipe); ``tensor_efficiency`` when not set.
    - ``tile``: the systolic array (or MMA) tile; matmul dimensions are padded up to it.
    - ``matmul_latency_s``: fixed cost of a matmul op (pipeline fill, weight load; on a GPU
      a GEMM kernel's prologue and wave tail); it makes small matmuls latency-bound.
    - ``matmul_latency_scope``: what pays it: ``matmul``, each of an op's ``count`` matmuls
      (a systolic array running each as its own instruction stream); ``kernel``, the op
      once, its problems tiled over the SMs together (a batched GEMM, fused attention).
    - ``hbm_efficiency``: fraction of HBM peak that streaming kernels sustain.
    - ``op_overhead_s``: issue overhead per op (kernel launch, instruction dispatch).
    - ``link_efficiency``: fraction of link peak that collectives achieve on the wire.
    - ``gemm_times``: ``roofline``, a GEMM's time from the tensor peak, the efficiency, the
      tile and the latency floor above; ``measured``, from the chip's measured GEMM table
      (``clustersim/catalog/kernels/``: kernel times over m, n and k, with the waves,
      tiles and launch floor they include), where the chip has one; ``tiled``, from the
      fastest NKI tutorial kernel for the shape on the core's engine facts
      (``clustersim.hardware.kernel_tiling.tiled_matmul_s``: instruction start-up, partly
      filled tiles, SBUF blocking and DMA in the time), never above
      ``tensor_efficiency`` of the peak, where the chip has an engine description.
    - ``attention_times``: ``roofline``, a fused attention core's matmuls at
      ``attention_efficiency``; ``measured``, its forward from the chip's measured fused
      attention table (by sequence, batch x heads, head dimension and grouping: the
      kernel's softmax and masking included), its backward at
      ``attention_backward_efficiency`` of the forward's rate.
    - ``attention_backward_efficiency``: with measured attention, the fraction of the
      forward kernel's FLOP rate its backward sustains (no table measures the backward);
      1 when not set.
    - ``compute_efficiency``: the fraction of its kernel's own speed (measured or
      roofline) a compute op runs at in the training stack's step: what no kernel table
      measures, such as gaps between launches, the stack's casts and FP8 scaling kernels
      that are not ops of the model, and clocks under a step's sustained load below a
      microbenchmark's; fitted per software stack, 1 when not set.
    """

    tensor_efficiency: Fraction
    fp8_tensor_efficiency: Fraction | None = None
    attention_efficiency: Fraction | None = None
    tile: tuple[PositiveInt, PositiveInt] = (128, 128)
    matmul_latency_s: Duration = 0.0
    matmul_latency_scope: Literal["matmul", "kernel"] = "matmul"
    hbm_efficiency: Fraction
    op_overhead_s: Duration = 0.0
    link_efficiency: Fraction = 1.0
    gemm_times: Literal["roofline", "measured", "tiled"] = "roofline"
    attention_times: Literal["roofline", "measured"] = "roofline"
    attention_backward_efficiency: Fraction | None = None
    compute_efficiency: Fraction = 1.0


class EngineClocks(Strict):
    """Clock of each engine in GHz: instruction floors are counted in its cycles."""

    tensor: Positive
    vector: Positive
    scalar: Positive
    gpsimd: Positive


class EnginesSpec(Strict):
    """What the tile-level engine model (``chip_model: engines``) needs of a core.

    - ``units``: tiles one engine runs at once (1 on a NeuronCore; the SMs of a GPU,
      whose tiles run in waves).
    - ``lanes``: elements an engine moves per cycle and unit (the 128 SBUF partitions
      of a NeuronCore; the FP32 cores of an SM).
    - ``matmul_tile``: (stationary, contraction, moving) sizes of one matmul
      instruction: 128 x 128 against 128 x 512 on the systolic array (one PSUM bank).
    - ``instr_min_cycles``: the fewest cycles any Tensor, Vector or Scalar instruction takes.
    - ``matmul_startup_cycles``: the start-up latency of one matmul instruction on the
      Tensor engine, on top of its streaming cycles (used by the bottom-up kernel
      tilings of :mod:`clustersim.hardware.kernel_tiling`; 0 where unpublished).
    - ``psum_banks``: accumulation groups in flight.
    - ``dma_queues`` x ``dma_queue_Bps``: the core's DMA engines; ``dma_setup_s`` the
      set-up of one transfer; ``dma_tile_bytes`` the transfer that saturates a queue.
    """

    units: PositiveInt = 1
    lanes: PositiveInt = 128
    clock_ghz: EngineClocks
    matmul_tile: tuple[PositiveInt, PositiveInt, PositiveInt] = (128, 128, 512)
    instr_min_cycles: int = Field(default=0, ge=0, le=100_000)
    matmul_startup_cycles: int = Field(default=0, ge=0, le=100_000)
    psum_banks: PositiveInt = 8
    dma_queues: PositiveInt = 1
    dma_queue_Bps: LinkRate
    dma_setup_s: Duration = 0.0
    dma_tile_bytes: Bytes = Field(default=512 * 1024, gt=0)


class CollectiveCosts(Strict):
    """What the communication runtime adds to a collective's wire time, per chip family.

    - ``runtime``: whose algorithm choice ``auto`` follows: ``neuron`` (the Neuron
      runtime's size rule) or ``nccl`` (NCCL's tuning model); by default ``nccl`` on
      GPUs and ``neuron`` elsewhere.
    - ``launch_s``: once per collective (the runtime's set-up and the first handshake).
    - ``step_s``: once per synchronous round of the algorithm (the semaphore handshake
      with the round's peers before data moves).
    - ``ring_step_s``: once per step of a ring (its handshake with its neighbour,
      which waits for one chunk, not for a whole round of its partners). On the
      ``nccl`` runtime a ring's step pays what any round does.
    - ``message_s``: per message a rank posts in one round (a DMA descriptor chain on
      Trainium), so a mesh round with p - 1 peers costs p - 1 of them.
    - ``efa_message_s``: added per message that crosses the scale-out network (EFA
      send/receive completion on top of the wire latency).
    - ``efa_efficiency``: fraction of the EFA bandwidth a collective sustains.
    - ``message_engines``: DMA engines that move one message of a round that is not
      pipelined (halving-doubling, mesh, trees): each such message runs at most at
      ``message_engines x engines.dma_queue_Bps`` (times ``chip.dma_reduce_throughput``
      when it reduces). A ring's stream is spread over many queues and is not bound.
      Zero: no bound.
    - ``nvls``: the scale-up switch reduces in the network (NVLink SHARP), so NCCL can
      run ``nvls`` inside one node; ``nvls_efficiency`` is the fraction of the link
      rate an NVLS all-reduce sustains (the switch's: on NVLS-tree it bounds the
      flows through the switch, and the shards that cross nodes run at EFA's rate).

    On the ``nccl`` runtime the protocol's own latencies (NCCL's tuning tables,
    ``network/runtimes/nccl.py``) are added as well; these fields then default to zero.
    """

    runtime: Literal["neuron", "nccl"] | None = None
    launch_s: Duration = Field(default=0.0, ge=0)
    step_s: Duration = Field(default=0.0, ge=0)
    ring_step_s: Duration = Field(default=0.0, ge=0)
    message_s: Duration = Field(default=0.0, ge=0)
    efa_message_s: Duration = Field(default=0.0, ge=0)
    efa_efficiency: Fraction = 1.0
    message_engines: float = Field(default=0.0, ge=0, le=1024, allow_inf_nan=False)
    nvls: bool = False
    nvls_efficiency: Fraction = 1.0


class MemoryOverride(Strict):
    """A chip's HBM overheads, replacing its family's in ``memory.yaml``
    (``clustersim.catalog.reserve``): what every rank holds besides the counted state,
    and the allocator's fragmentation as a fraction of the dynamic memory."""

    reserve_bytes: Bytes | None = Field(default=None, ge=0)
    """Bytes each rank holds besides weights, gradients, optimizer state and activations."""
    fragmentation: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    """What the allocator reserves beyond the dynamic memory, as a fraction of it."""


class ChipSpec(Strict):
    name: str
    vendor: Literal["aws", "nvidia", "google"]
    family: Literal["trainium", "gpu", "tpu"]
    cores: int = Field(ge=1, le=1024)
    lnc_default: int = Field(ge=1)
    lnc_options: tuple[int, ...] = (1,)
    core: CoreSpec
    chip_tflops: TensorPeaks
    hbm_bytes: Bytes
    hbm_bw_Bps: LinkRate
    dma_bw_Bps: LinkRate
    chip_to_chip_bw_Bps: LinkRate
    dma_setup_s: Duration = Field(default=0.0, ge=0)
    dma_reduce_throughput: Fraction = 1.0
    power_w: Power
    calibration: Calibration
    collective_sm_fraction: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False)
    """Share of the chip's compute a collective takes while it runs (NCCL's SMs on a GPU)."""
    engines: EnginesSpec | None = None
    """The tile-level description for ``chip_model: engines``; chips without one run
    the roofline model only."""
    collectives: CollectiveCosts = CollectiveCosts()
    memory: MemoryOverride = MemoryOverride()
    """Overrides of the family's HBM overheads (``memory.yaml``); empty: the family's."""
    sources: dict[str, str]

    @property
    def dma_engine_Bps(self) -> float:
        """One DMA engine's rate: the engine model's ``engines.dma_queue_Bps``, which the
        collectives' message bound uses too (0 without an engine description)."""
        return float(self.engines.dma_queue_Bps) if self.engines is not None else 0.0

    @property
    def efa_link_efficiency(self) -> float:
        """Fraction of the EFA links' bandwidth a collective sustains."""
        return self.calibration.link_efficiency * self.collectives.efa_efficiency

    @property
    def runtime(self) -> Literal["neuron", "nccl"]:
        """The communication runtime whose algorithm choice ``auto`` follows."""
        if self.collectives.runtime is not None:
            return self.collectives.runtime
        return "nccl" if self.family == "gpu" else "neuron"

    @model_validator(mode="after")
    def _lnc_consistent(self) -> ChipSpec:
        if self.lnc_default not in self.lnc_options:
            raise ValueError(
                f"lnc_default {self.lnc_default} not in lnc_options {self.lnc_options}"
            )
        for lnc in self.lnc_options:
            if self.cores % lnc:
                raise ValueError(f"lnc {lnc} does not divide {self.cores} cores")
        if self.calibration.gemm_times == "tiled" and self.engines is None:
            raise ValueError(
                f"calibration.gemm_times 'tiled' needs a NeuronCore's engine description "
                f"(engines), which {self.name} has not"
            )
        return self

    @field_validator("calibration")
    @classmethod
    def _tiled_on_neuroncores(cls, value: Calibration, info: ValidationInfo) -> Calibration:
        family = info.data.get("family")
        if value.gemm_times == "tiled" and family is not None and family != "trainium":
            raise ValueError(
                f"gemm_times 'tiled' times NKI kernels on a NeuronCore; a {family} chip "
                "takes roofline or measured"
            )
        return value


class FabricSpec(Strict):
    """The scale-up fabric inside one instance.

    ``topology`` names a registered builder (``torus2d``, ``switch``, ...).
    ``link_bw_Bps`` is per link and per direction; ``lanes`` parallel lanes share it.
    """

    topology: str
    dims: tuple[PositiveInt, ...] = ()
    link_bw_Bps: LinkRate
    link_latency_s: Duration
    lanes: int = Field(default=1, ge=1, le=64)


class UltraServerSpec(Strict):
    """Instances joined by NeuronLink into one UltraServer (a 3D torus on Trn2).

    :attr:`last_partial` (a scenario's ``cluster.domain_fill: last``, not a catalog field):
    the cluster's last domain may hold fewer than ``instances``: it is built at full size
    and its empty slots hold no ranks.
    """

    instances: int = Field(ge=1)
    topology: str
    link_bw_Bps: LinkRate
    link_latency_s: Duration
    _last_partial: bool = PrivateAttr(default=False)

    @property
    def last_partial(self) -> bool:
        """Whether the cluster's last domain may be partly filled."""
        return self._last_partial

    def partly_filled(self) -> UltraServerSpec:
        """This UltraServer with its cluster's last domain allowed to be partly filled."""
        out = self.model_copy()
        out._last_partial = True
        return out


class EfaSpec(Strict):
    """Scale-out network of one instance: total NIC bandwidth and one-way latency.

    ``fabric`` names the registered scale-out fabric that joins the scale-up
    domains (``nonblocking``, ``fat_tree``/``clos``, ``rail``; see
    ``clustersim.network.fabric.fabrics``). The switched fabrics read ``tiers`` (switch
    tiers, leaves included), ``radix`` (ports per switch) and ``oversubscription``
    (a leaf's chip bandwidth over its uplink bandwidth, or with
    ``oversubscription_at: top`` the top tier's: the pods below it are then
    non-blocking, as UltraCluster networks are built). The defaults, a
    non-blocking two-tier fabric of 64-port switches, are modelling choices, not
    published AWS figures.

    ``network`` says what the section models: AWS's EFA (the default), InfiniBand or
    RoCE. ``sharp``: the switches reduce in the network (NVIDIA SHARP, on InfiniBand
    only) and NCCL's CollNet is on, so an all-reduce across nodes may run ``sharp`` or
    ``nvls_sharp`` (:mod:`clustersim.network.collectives.algorithms.innetwork`).
    """

    bandwidth_Bps: LinkRate
    latency_s: Duration
    nics: int = Field(default=1, ge=1)
    fabric: str = "nonblocking"
    tiers: int = Field(default=2, ge=1, le=6)
    radix: int = Field(default=64, ge=2, le=4096)
    oversubscription: float = Field(default=1.0, gt=0, le=1024, allow_inf_nan=False)
    oversubscription_at: Literal["leaf", "top"] = "leaf"
    network: Literal["efa", "infiniband", "roce"] = "efa"
    sharp: bool = False

    @field_validator("sharp")
    @classmethod
    def _sharp_needs_infiniband(cls, value: bool, info: ValidationInfo) -> bool:
        network = info.data.get("network", "efa")
        if value and network != "infiniband":
            raise ValueError(
                f"in-network reduction (SHARP) needs InfiniBand switches; this scale-out "
                f"network is {network} (network: infiniband declares one)"
            )
        return value


class Prices(Strict):
    """USD per instance-hour, by pricing mode. Absent modes are unavailable."""

    on_demand: Positive
    reserved: Positive | None = None
    capacity_block: Positive | None = None


class OwnedCost(Strict):
    """Owning the instance instead of renting it (``cost.pricing: owned``, TCO).

    ``capex_usd`` buys one instance; it is written off straight-line over
    ``amortization_years`` of round-the-clock use. Power is the instance's chips
    plus its host, times ``pue``, at ``usd_per_kwh``. ``opex_fraction_per_year``
    adds maintenance, space and staff as a yearly fraction of the capex.
    """

    capex_usd: Positive
    amortization_years: Positive
    pue: float = Field(ge=1, le=5, allow_inf_nan=False)
    usd_per_kwh: float = Field(ge=0, le=10, allow_inf_nan=False)
    opex_fraction_per_year: float = Field(default=0.0, ge=0, le=10, allow_inf_nan=False)


class InstanceSpec(Strict):
    name: str
    chip: str
    chips: int = Field(ge=1)
    fabric: FabricSpec
    ultraserver: UltraServerSpec | None = None
    efa: EfaSpec
    prices_usd_per_hour: Prices
    host_power_w: Power = 0.0
    owned: OwnedCost | None = None
    sources: dict[str, str]
