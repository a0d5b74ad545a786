"""Model FLOPs, the numerator of MFU (PaLM's definition, Chowdhery et al., arXiv 2204.02311).

FLOPs per token = 6N + 12*L*H*Q*T, where

- N counts every parameter that takes part in a matmul per token: all layer
  parameters (norm weights included; for MoE only the experts a token uses) and
  the LM head. Only the input lookup tables (token and learned position
  embeddings) are left out; a tied model's head still counts, since its matmul
  still runs;
- 12*L*H*Q*T is the attention score and value matmuls (forward and backward) of
  L layers, H heads of dimension Q (H*Q = hidden) over a sequence of T tokens,
  counted without the causal mask's savings, as PaLM does. Under multi-head latent
  attention queries and keys (Q_qk) are wider than values (Q_v): 6*L*H*(Q_qk + Q_v)*T.

Model FLOPs exclude recomputation; the hardware FLOPs of the programs include it,
which is what HFU uses. The programs count causal attention at half (flash
attention skips the masked blocks), so when attention dominates (sequence
length comparable to hidden size) PaLM's MFU can exceed HFU; ``causal=True``
gives the masked count.
"""

from __future__ import annotations

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import TrainingCfg
from clustersim.workload.memory import non_embedding_param_count

__all__ = ["model_flops_per_step", "model_flops_per_token", "model_matmul_params"]


def model_matmul_params(model: ModelSpec) -> int:
    """N of the PaLM formula: the parameters a token's matmuls touch."""
    tied_head = model.vocab * model.hidden if model.tied_embeddings else 0
    return non_embedding_param_count(model, active=True) + tied_head


def model_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """Training FLOPs per token (forward and backward): 6N + 12*L*H*Q*T.

    ``causal=True`` halves the attention term (6*L*H*Q*T), counting only the
    unmasked scores, as the programs' hardware FLOPs do; PaLM's MFU does not.
    """
    # 12*H*Q*T with Q the head width; under MLA queries and keys are wider than values,
    # so the score and value matmuls count half each: 6*H*(Q_qk + Q_v)*T.
    widths = model.qk_head_dim + model.head_dim
    attention = (3.0 if causal else 6.0) * model.layers * model.heads * widths * seq_len
    return 6.0 * model_matmul_params(model) + attention


def model_flops_per_step(model: ModelSpec, train: TrainingCfg, *, causal: bool = False) -> float:
    """Model FLOPs of one training step: per token times the global batch's tokens."""
    tokens = train.global_batch_size * train.seq_len
    return model_flops_per_token(model, train.seq_len, causal=causal) * tokens
