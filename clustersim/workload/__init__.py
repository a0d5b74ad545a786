"""Workload: the parallel layout, the lowering of a transformer into per-rank programs,
pipeline schedules, the memory model and model FLOPs."""

from clustersim.workload.checks import validate
from clustersim.workload.dims import Dims, make_dims, padded_vocab
from clustersim.workload.flops import (
    model_flops_per_step,
    model_flops_per_token,
    model_matmul_params,
)
from clustersim.workload.layout import GROUP_NAMES, Layout, make_layout
from clustersim.workload.memcheck import MemoryCheck, check_fits, memory_check
from clustersim.workload.memory import (
    MemoryBreakdown,
    layer_activation_bytes,
    memory_per_rank,
    non_embedding_param_count,
    param_count,
    peak_memory,
    rank_param_count,
    stage_param_count,
)
from clustersim.workload.program import Instr, Kind, Phase, Program
from clustersim.workload.schedules import (
    get_schedule,
    peak_in_flight,
    register_schedule,
    schedule_names,
)
from clustersim.workload.transformer import (
    build_programs,
    first_chunk_buckets,
    grad_bucket_size,
    grad_buckets,
    microbatches,
)

__all__ = [
    "GROUP_NAMES",
    "Dims",
    "Instr",
    "Kind",
    "Layout",
    "MemoryBreakdown",
    "MemoryCheck",
    "Phase",
    "Program",
    "build_programs",
    "check_fits",
    "first_chunk_buckets",
    "get_schedule",
    "grad_bucket_size",
    "grad_buckets",
    "layer_activation_bytes",
    "make_dims",
    "make_layout",
    "memory_check",
    "memory_per_rank",
    "microbatches",
    "model_flops_per_step",
    "model_flops_per_token",
    "model_matmul_params",
    "non_embedding_param_count",
    "padded_vocab",
    "param_count",
    "peak_in_flight",
    "peak_memory",
    "rank_param_count",
    "register_schedule",
    "schedule_names",
    "stage_param_count",
    "validate",
]
