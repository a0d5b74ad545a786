"""Pydantic models of a scenario file. Unknown keys are errors everywhere."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, field_validator, model_validator

from clustersim.catalog import register_model
from clustersim.catalog.schema import Bytes, Strict
from clustersim.names import canonical_value
from clustersim.scenario.failures import FailuresCfg
from clustersim.scenario.moe import MoECfg
from clustersim.scenario.serving import ServingCfg, serving_scenario
from clustersim.scenario.workload import WorkloadCfg, trace_scenario

__all__ = [
    "ClusterCfg",
    "CostCfg",
    "FailuresCfg",
    "Fp8Cfg",
    "FsdpCfg",
    "MoECfg",
    "OutputCfg",
    "ParallelismCfg",
    "RecomputeModule",
    "Scenario",
    "ServingCfg",
    "SoftwareCfg",
    "TrainingCfg",
]

Count = int
Overrides = dict[str, Any]

RecomputeModule = Literal[
    "layernorm", "mla_up_proj", "core_attn", "mlp", "moe", "moe_act", "shared_experts"
]
"""Megatron-Core's recompute modules, in forward order: the one list of their names
(``clustersim.workload.recompute.MODULES`` is read from it, and reruns them in this order)."""


@register_model
class ClusterCfg(Strict):
    """Which instances, how many, and inline overrides of their catalog fields.

    ``chip``, ``neuronlink`` (the scale-up fabric: NeuronLink, or NVLink on GPU
    nodes), ``efa`` and ``ultraserver`` are mappings merged over the catalog entry.
    ``collectives`` picks an algorithm per collective type (``auto`` by default).
    ``fabric_file`` names a fabric graph that replaces the built fabric.
    ``domain_fill`` puts that many instances in every scale-up domain of an UltraServer
    (a GB200 NVL72 rack filled with fewer trays, say), from 1 to the full domain; ``last``
    fills whole domains and leaves the last one partly filled (64 trays: 3 racks of 18
    and one of 10), the default where ``count`` does not fill whole NVLink switch domains.
    """

    instance: str
    """Catalog instance type (`clustersim catalog instances`), such as `trn2.48xlarge`."""
    count: int = Field(default=1, ge=1, le=10_000_000)
    """Number of instances."""
    lnc: int | None = Field(default=None, ge=1, le=64)
    """Logical NeuronCore size: physical cores per rank (ranks per chip = cores / lnc); default:
    the chip's catalog `lnc_default` (2 on Trn2)."""
    chip: Overrides = Field(default_factory=dict)
    """Chip fields merged over the catalog entry (`clustersim catalog chips NAME`), such as
    `{hbm_bytes: 64GiB}`."""
    neuronlink: Overrides = Field(default_factory=dict)
    """Scale-up fabric fields (NeuronLink, or NVLink on GPU instances) merged over the instance's
    `fabric` entry: `topology`, `dims`, `link_bw_Bps`, `link_latency_s`, `lanes`."""
    efa: Overrides = Field(default_factory=dict)
    """Scale-out network fields merged over the instance's `efa` entry: `bandwidth_Bps`,
    `latency_s`, `nics`, `fabric`, `tiers`, `radix`, `oversubscription`, `network`, `sharp`
    (`false` turns off in-network reduction on an InfiniBand fabric that has it)."""
    ultraserver: Overrides = Field(default_factory=dict)
    """UltraServer fields merged over the instance's entry: `instances`, `topology`,
    `link_bw_Bps`, `link_latency_s`."""
    domain_fill: Annotated[int, Field(ge=1, le=100_000)] | Literal["last"] | None = None
    """Instances in each scale-up domain of an UltraServer, from 1 to the full domain (a GB200
    NVL72 rack with fewer trays), or `last`: whole domains, the last one partly filled when
    `count` is not a multiple of the domain (64 GB200 trays: 3 racks of 18 and one of 10);
    default: full domains, and `last` where `count` does not fill whole NVLink switch domains.
    Only NVLink switch domains (nvl72) may be partly filled."""
    prices_usd_per_hour: Overrides = Field(default_factory=dict)
    """Prices in USD per instance-hour by pricing mode (`on_demand`, `reserved`,
    `capacity_block`), merged over the catalog's."""
    collectives: dict[str, str] = Field(default_factory=dict)
    """Algorithm per collective type, such as `{all_reduce: ring}` (an unknown name lists the
    valid ones); a type left out is `auto`."""
    fabric_file: str | None = Field(default=None, min_length=1, max_length=4096)
    """A fabric graph (GraphML, GML or node-link JSON) that replaces the built fabric; relative
    to the scenario file."""

    @field_validator("collectives", mode="before")
    @classmethod
    def _canonical_collectives(cls, value: Any) -> Any:
        """``all-reduce: halving-doubling`` reads as ``all_reduce: halving_doubling``; the
        names are checked against the algorithm registry when the run is planned."""
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        for key, name in value.items():
            op = canonical_value(key)
            if op in out:
                raise ValueError(f"{key!r} names the same collective as another key ({op})")
            out[op] = canonical_value(name)
        return out


PricingMode = Literal["on_demand", "reserved", "capacity_block", "owned"]
"""``cost.pricing``; typed with hyphens or in any case, it reads as one of these."""

FSDP_UNITS: tuple[str, ...] = ("layer", "stage")
"""What one FSDP unit gathers: a transformer block (the embedding and the LM head are
units of their own), or every parameter of the rank's pipeline stage at once."""


@register_model
class FsdpCfg(Strict):
    """How ``zero: 3`` gathers parameters (PyTorch FSDP2 semantics).

    ``unit``: one of ``FSDP_UNITS``. ``reshard_after_forward``: free a unit's gathered
    parameters after its forward and gather them again before its backward.
    ``prefetch``: units gathered ahead of the one computing (0: gather on demand).
    """

    unit: str = "layer"
    """What one FSDP unit gathers: `layer` (a transformer block) or `stage` (every parameter of
    the rank's pipeline stage)."""
    reshard_after_forward: bool = True
    """Free a unit's gathered parameters after its forward, and gather them again before its
    backward."""
    prefetch: int = Field(default=1, ge=0, le=64)
    """Units gathered ahead of the one computing (0: gather on demand)."""

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, value: str) -> str:
        if value not in FSDP_UNITS:
            raise ValueError(f"unknown FSDP unit {value!r}; valid: {', '.join(FSDP_UNITS)}")
        return value


@register_model
class ParallelismCfg(Strict):
    """The parallel layout. ``dp`` may be omitted: it then fills the ranks left."""

    tp: int = Field(default=1, ge=1, le=1_000_000)
    """Tensor-parallel degree: ranks that split each layer's matmuls."""
    pp: int = Field(default=1, ge=1, le=1_000_000)
    """Pipeline-parallel degree: stages the layers are cut into."""
    dp: int | None = Field(default=None, ge=1, le=100_000_000)
    """Data-parallel degree; absent: the ranks left, ranks / (tp x pp x cp)."""
    cp: int = Field(default=1, ge=1, le=1_000_000)
    """Context-parallel degree: ranks that split each sequence."""
    ep: int = Field(default=1, ge=1, le=1_000_000)
    """Expert-parallel degree (MoE models): ranks that split the experts, carved out of a stage's
    tp x cp x dp ranks."""
    # 1 shards the optimizer state, 2 the gradients too, 3 the parameters too (FSDP),
    # over the shard group of dp_shard DP ranks (default: all of dp); the other
    # dp / dp_shard replicas all-reduce their shards (hybrid sharding, HSDP).
    zero: Literal[0, 1, 2, 3] = 0
    """ZeRO stage: 0 replicates, 1 shards the optimizer state, 2 the gradients too, 3 the
    parameters too (FSDP)."""
    dp_shard: int | None = Field(default=None, ge=1, le=100_000_000)
    """DP ranks in one ZeRO shard group (hybrid sharding, HSDP, with zero 2 or 3); absent: all of
    dp."""
    fsdp: FsdpCfg = Field(default_factory=FsdpCfg)
    """How `zero: 3` gathers parameters."""
    etp: int | None = Field(default=None, ge=1, le=1_000_000)
    """The experts' own tensor-parallel degree; absent: `tp`."""
    microbatch_size: int = Field(default=1, ge=1, le=1_000_000)
    """Sequences per microbatch."""
    # dualpipe: DeepSeek's DualPipeV (two chunks per stage in a V, clustersim.workload.schedules)
    schedule: Annotated[Literal["1f1b", "gpipe", "dualpipe"], BeforeValidator(canonical_value)] = (
        "1f1b"
    )
    """Pipeline schedule: `1f1b` (interleaved with `virtual_stages` > 1), `gpipe`, or `dualpipe`
    (DeepSeek's DualPipeV)."""
    # Model chunks per stage: 2 or more cuts the layers into pp x virtual_stages chunks,
    # dealt round-robin to the stages (interleaved 1F1B with schedule 1f1b).
    virtual_stages: int = Field(default=1, ge=1, le=1024)
    """Model chunks per pipeline stage; 2 or more deal pp x virtual_stages chunks round-robin to
    the stages."""
    recompute: Literal["none", "selective", "full"] = "selective"
    """Activation recomputation in the backward: `none`, `selective` (the modules of
    `recompute_modules`) or `full` (every layer)."""
    # With recompute: selective, the modules rerun in the backward (Megatron-Core's
    # recompute_modules; absent: its default [core_attn]); clustersim.workload.recompute.
    recompute_modules: list[RecomputeModule] | None = Field(
        default=None, min_length=1, max_length=len(get_args(RecomputeModule))
    )
    """With `recompute: selective`, the modules rerun in the backward (Megatron-Core's names);
    absent: `[core_attn]`."""
    # With recompute: selective, how the software stack decides what is kept: modules
    # (Megatron-Core: the modules of recompute_modules rerun) or op (torchtitan's
    # selective_ac_option "op": per op; clustersim.workload.recompute). Absent: the
    # software stack's rule (`clustersim catalog stacks`), modules where it names none.
    recompute_policy: Literal["modules", "op"] | None = None
    """With `recompute: selective`, what is kept: `modules` (Megatron-Core: the modules of
    `recompute_modules` rerun) or `op` (torchtitan: the outputs of every other matmul and of
    attention are kept, every other op reruns); absent: the software stack's rule."""
    sequence_parallel: bool = True
    """Sequence parallelism with tp > 1: TP collectives are reduce-scatter and all-gather, and
    activations outside the matmuls are split over TP; false: all-reduce."""
    # How the backward of a tensor-parallel sublayer overlaps its TP collectives with
    # its own compute (clustersim.workload.ops): blocking (every TP collective blocks),
    # backward (Megatron-Core's linear layers: the column-parallel backward's input
    # all-gather runs under its input-gradient GEMM, and the reduce-scatter, or
    # all-reduce, of that gradient under the weight-gradient GEMM), dataflow (a
    # compiler that orders work only by its dependencies, as the Neuron compiler does:
    # the input all-gather starts with the sublayer's backward, and both of its
    # weight-gradient GEMMs run under the reduce-scatter). Absent: the software stack's
    # rule (`clustersim catalog stacks`), blocking where the stack names none.
    tp_comm_overlap: Literal["blocking", "backward", "dataflow", "userbuffers"] | None = None
    """How a TP sublayer's backward overlaps its collectives with its compute: `blocking`,
    `backward` (Megatron-Core) or `dataflow` (the Neuron compiler); absent: the software
    stack's rule."""
    # flash: the attention core keeps scores on chip; unfused: scores and probabilities
    # go through HBM and the causal square is computed whole (Megatron-LM before flash
    # attention; see clustersim.workload.ops)
    attention: Literal["flash", "unfused"] = "flash"
    """`flash` keeps attention scores on chip; `unfused` moves scores and probabilities through
    HBM and computes the whole causal square."""
    # How flash attention runs under cp > 1 (Transformer Engine's cp_comm_type).
    # all_gather: K and V all-gathered once, one causal kernel over them, their
    # gradients reduce-scattered. p2p: cp partial steps over K and V chunks passed
    # round a ring, merged through their log-sum-exps (clustersim.workload.cp_ring).
    # Absent: the software stack's rule (`clustersim catalog stacks`): p2p under
    # Megatron-Core's stacks, all_gather where the stack names none.
    cp_comm_type: Literal["all_gather", "p2p"] | None = None
    """How attention runs with cp > 1 (Transformer Engine's `cp_comm_type`): `all_gather` gathers
    K and V once, `p2p` passes their chunks round a ring; absent: the software stack's rule."""
    uneven_stages: bool = False
    """Allow a pp that does not divide the layers (the outer stages get fewer)."""
    # Megatron's distributed optimizer (--overlap-param-gather, with zero: 1): the
    # all-gather of the updated parameters runs under the next step's forward instead
    # of after the optimizer, each bucket waited for where the forward first needs it
    # (clustersim.workload.paramgather).
    overlap_param_gather: bool = False
    """With `zero: 1`, all-gather the updated parameters under the next step's forward instead of
    after the optimizer (Megatron's `--overlap-param-gather`)."""
    # Megatron-Core's overlap_moe_expert_parallel_comm: each backward and the adjacent
    # forward of another microbatch run as one unit, each one's expert all-to-alls
    # hidden behind the other's compute (clustersim.workload.overlap).
    overlap_moe_a2a: bool = False
    """Hide each microbatch's expert all-to-alls behind another microbatch's compute
    (Megatron-Core's `overlap_moe_expert_parallel_comm`)."""
    # The size at which a gradient bucket closes (after the whole parameter that
    # reaches it: workload.gradbuckets.grad_buckets). 64 MiB names no source;
    # Megatron-Core's DDP default is max(40M, 1M x dp) elements (80 MB of bf16
    # gradients up to dp 40), and PyTorch DDP's bucket_cap_mb is 25 MiB.
    # At least 1 MiB: a tiny bucket means one collective per few bytes of gradient
    # (1 B buckets of a 7B model are 14e9 instructions and exhaust memory).
    grad_bucket_bytes: Bytes = Field(default=64 * 2**20, ge=2**20)
    """Size at which a gradient bucket closes (bytes, at least 1 MiB; default 64 MiB)."""
    # Which model chunks cut their gradients at grad_bucket_bytes (ZeRO 0 and 1).
    # first_chunk: Megatron-Core's DistributedDataParallel, only the first pipeline
    # stage's first model chunk; every other chunk's gradients are one bucket, reduced
    # once its last backward has run (workload.gradbuckets.first_chunk_buckets).
    # every_chunk (the default): every chunk of every stage. first_chunk is not the
    # default: what it does to the reference rows is in the calibration and validation
    # page of the docs.
    grad_bucketing: Literal["first_chunk", "every_chunk"] = "every_chunk"
    """Which model chunks cut their gradients into buckets (ZeRO 0 and 1): `every_chunk`, or
    `first_chunk` (Megatron-Core DDP: only the first stage's first chunk)."""
    # Megatron's --overlap-grad-reduce (ZeRO 0 and 1): each bucket's reduction starts
    # in the last backward as soon as its gradients are complete. false: every model
    # chunk's gradients are one bucket, reduced after the whole forward-backward of all
    # microbatches (Megatron-LM before 2023: workload.gradbuckets.grad_bucket_size).
    # The SC'21 rows keep true: false widens the A100 fit's residuals (the calibration page).
    overlap_grad_reduce: bool = True
    """Start each gradient bucket's reduction in the last backward once it is complete (ZeRO 0
    and 1); false: after the whole forward-backward."""


@register_model
class Fp8Cfg(Strict):
    """How an FP8 recipe runs (``precision: fp8``; ignored at other precisions).

    ``scaling``: ``delayed`` (Transformer Engine's delayed scaling: each cast uses the
    scale from earlier steps' amax history, so the cast is one pass) or ``current``
    (per-tensor current scaling, Megatron's ``fp8_recipe: tensorwise``: the amax of the
    tensor itself is taken by a pass of its own before the cast). ``bf16_layers``: the
    first and the last that many transformer layers run in BF16 (Megatron's
    ``first_last_layers_bf16`` with ``num_layers_at_start_in_bf16`` and
    ``num_layers_at_end_in_bf16``).
    """

    scaling: Literal["delayed", "current"] = "delayed"
    """`delayed` (scales from earlier steps' amax history) or `current` (a pass of its own takes
    each tensor's amax before the cast)."""
    bf16_layers: int = Field(default=0, ge=0, le=100_000)
    """The first and the last this many transformer layers run in BF16."""


@register_model
class TrainingCfg(Strict):
    seq_len: int = Field(ge=1, le=100_000_000)
    """Tokens per sequence."""
    global_batch_size: int = Field(ge=1, le=1_000_000_000)
    """Sequences per training step over all replicas; a multiple of dp x microbatch_size."""
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    """Precision of the matmuls: the tensor peak that compute and MFU use."""
    fp8: Fp8Cfg = Field(default_factory=Fp8Cfg)
    """How the FP8 recipe runs, with `precision: fp8`."""
    # The dtype the model's parameters, and so their gradients, are held in (ZeRO 0
    # and 1). bf16: Megatron's mixed precision (bf16 weights and gradients, an FP32
    # copy in the optimizer). fp32: torch.autocast (NeuronX Distributed's BF16
    # autocast), which casts each matmul's inputs and leaves the parameters FP32, so
    # the data-parallel gradient reduction and ZeRO-1's parameter all-gather move
    # 4 B an element (torch-xla's ZeroRedundancyOptimizer reduce-scatters param.grad
    # in its own dtype and gathers shards cast to param.dtype). workload.gradbuckets.
    param_dtype: Literal["bf16", "fp32"] = "bf16"
    """The dtype parameters and their gradients are held in (ZeRO 0 and 1): `bf16` (Megatron's
    mixed precision) or `fp32` (torch.autocast)."""
    # Adam's two moments in HBM: fp32, or bf16 (Megatron-Core's precision-aware
    # optimizer with exp_avg_dtype and exp_avg_sq_dtype bf16); the master weights
    # stay fp32 (workload.memory).
    optimizer_moments: Literal["fp32", "bf16"] = "fp32"
    """The dtype of Adam's two moments in HBM; the master weights stay FP32."""
    steps: int = Field(default=1, ge=1, le=1000)
    """Training steps simulated; `step_time_s` is their mean."""


@register_model
class CostCfg(Strict):
    """How the cluster is paid for.

    ``on_demand``, ``reserved`` and ``capacity_block`` rent at the instance's
    catalog price (``usd_per_instance_hour`` overrides it). ``owned`` is a TCO:
    capex per instance written off straight-line over ``amortization_years``,
    plus power x ``pue`` x ``usd_per_kwh``, plus ``opex_fraction_per_year`` x capex;
    each key left out takes the instance's catalog ``owned`` default. ``pue`` also sets
    the energy figures of every mode.
    """

    pricing: Annotated[
        Literal["on_demand", "reserved", "capacity_block", "owned"],
        BeforeValidator(canonical_value),
    ] = "on_demand"
    """`on_demand`, `reserved` or `capacity_block` (the instance's catalog price), or `owned` (a
    TCO from capex, power and opex)."""
    usd_per_instance_hour: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    """USD per instance-hour, in place of the price of any mode."""
    capex_usd_per_instance: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    """With `owned`: the purchase price of one instance (USD); default: the catalog's."""
    amortization_years: float | None = Field(default=None, gt=0, le=50, allow_inf_nan=False)
    """With `owned`: years the capex is written off over, straight-line; default: the catalog's."""
    pue: float | None = Field(default=None, ge=1, le=5, allow_inf_nan=False)
    """Power usage effectiveness (facility power over IT power), for `owned` power cost and the
    energy figures; default: the catalog's, else 1."""
    usd_per_kwh: float | None = Field(default=None, ge=0, le=10, allow_inf_nan=False)
    """With `owned`: the price of electricity (USD per kWh); default: the catalog's."""
    opex_fraction_per_year: float | None = Field(default=None, ge=0, le=10, allow_inf_nan=False)
    """With `owned`: maintenance, space and staff per year, as a fraction of the capex; default:
    the catalog's."""


@register_model
class SoftwareCfg(Strict):
    stack: str | None = Field(default=None, min_length=1, max_length=100)
    """The software stack (`clustersim catalog stacks`): its collective rules, overlap and fitted
    constants; default: the chip family's."""
    compile: bool | None = None
    """Whether the model runs compiled (torch.compile, Inductor's fused elementwise kernels) or
    eagerly (one PyTorch kernel per elementwise op), for a stack with that switch (torchtitan:
    eager by default); a stack with only fused kernels (Megatron-Core, NeMo, NxD) refuses
    `false`. Default: the stack's rule."""
    host_op_s: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    """Seconds the host takes to issue one op of the program (a lazy tensor's trace under
    PyTorch/XLA, a kernel's launch under eager PyTorch); the device waits for an op until
    it is issued, the host running ahead of it. Default: the stack's (`clustersim catalog
    stacks`), 0 where it has none: the host never holds the device back."""


@register_model
class OutputCfg(Strict):
    dir: str | None = None
    """Where `run` writes, relative to the working directory (`--out` overrides it); default:
    `reports/<name>`."""
    trace: bool = True
    """Write the op and flow trace: `trace.parquet` and the Chrome trace `trace.json`."""
    html: bool = True
    """Write `report.html` and its PNG figures."""


@register_model
class Scenario(Strict):
    name: str = Field(min_length=1, max_length=200)
    """The scenario's name: the report's title, and the default output folder `reports/<name>`."""
    description: str = ""
    """Free text, shown under the report's title."""
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    """Seeds every random draw: expert popularity, failure times, request arrivals and lengths."""
    cluster: ClusterCfg
    """The instances, how many, and overrides of their catalog fields."""
    model: str | dict[str, Any] | None = None
    """A catalog model (`clustersim catalog models`), or a mapping: a catalog `name` with fields
    to override, or a full shape; absent only with `workload`."""
    workload: WorkloadCfg | None = None
    """Chakra execution traces, in place of `model`, `parallelism` and `moe`."""
    parallelism: ParallelismCfg = Field(default_factory=ParallelismCfg)
    """The parallel layout, sharding, pipeline schedule and recomputation."""
    training: TrainingCfg
    """Sequence length, batch, precision and steps; a serving scenario has `serving` instead."""
    serving: ServingCfg | None = None
    """An inference-serving workload in place of `training` (`clustersim serve`)."""
    failures: FailuresCfg = Field(default_factory=FailuresCfg)
    """Failures injected inside the step, and the long-horizon reliability model."""
    moe: MoECfg = Field(default_factory=MoECfg)
    """How the router spreads tokens over the experts (models with MoE layers only)."""
    cost: CostCfg = Field(default_factory=CostCfg)
    """How the cluster is paid for."""
    software: SoftwareCfg = Field(default_factory=SoftwareCfg)
    """The software stack that runs the job."""
    output: OutputCfg = Field(default_factory=OutputCfg)
    """What `clustersim run` writes, and where."""
    chip_model: Literal["roofline", "engines"] = "roofline"
    """`roofline`: an op lasts as long as its busiest engine or its HBM traffic; `engines`: ops
    run as tile streams on each engine (chips with an `engines` entry)."""
    catalog_overlay: str | None = Field(default=None, min_length=1, max_length=4096)
    """A YAML file of catalog entries merged over the shipped catalog (what `clustersim calibrate
    --out` writes); relative to the scenario file."""

    @model_validator(mode="before")
    @classmethod
    def _trace_workload(cls, data: Any) -> Any:
        """``workload`` replaces ``model``, ``parallelism`` and ``moe`` (scenario.workload)."""
        data = serving_scenario(trace_scenario(data))
        if isinstance(data, dict) and data.get("workload") is None and data.get("model") is None:
            raise ValueError("model is required (or a workload: {chakra: PREFIX})")
        return data

    @field_validator("name")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name must not be blank")
        return value
