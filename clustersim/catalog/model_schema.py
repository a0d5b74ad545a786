"""Pydantic models of the catalog's models (``models.yaml``): the transformer's shape,
its mixture of experts and its multi-head latent attention. Every entry carries
``sources``, as the chips and instances do (:mod:`clustersim.catalog.schema`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clustersim.catalog._strict import Strict

__all__ = ["MLASpec", "MoESpec", "ModelSpec"]


class MoESpec(Strict):
    """Mixture-of-experts layers (``clustersim.workload.moe`` lowers them).

    ``shared_experts`` run on every token beside the routed ones; the first
    ``dense_layers`` layers are dense MLPs of ``ffn_hidden``. ``scoring`` is the
    router's gate function (softmax over the experts, or DeepSeek-V3's sigmoid).
    ``max_nodes_per_token`` bounds the nodes a token's experts may sit on
    (DeepSeek-V3's node-limited routing); 0 means no limit.
    """

    experts: int = Field(ge=1, le=1_000_000)
    top_k: int = Field(ge=1, le=1_000_000)
    expert_ffn_hidden: int = Field(ge=1, le=100_000_000)
    shared_experts: int = Field(default=0, ge=0, le=1024)
    dense_layers: int = Field(default=0, ge=0, le=100_000)
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    max_nodes_per_token: int = Field(default=0, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} is above the {self.experts} experts")
        return self


class MLASpec(Strict):
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2412.19437 section 2.1.1).

    Queries and keys/values are projected down to low-rank latents
    (``q_lora_rank``, ``kv_lora_rank``; a ``q_lora_rank`` of 0 projects queries
    directly), normalised, and projected up per head: ``qk_nope_head_dim`` +
    ``qk_rope_head_dim`` for queries and keys (the RoPE part of the key is one
    head shared by all heads), ``v_head_dim`` for values.
    """

    q_lora_rank: int = Field(ge=0, le=10_000_000)
    kv_lora_rank: int = Field(ge=1, le=10_000_000)
    qk_nope_head_dim: int = Field(ge=0, le=100_000)
    qk_rope_head_dim: int = Field(ge=0, le=100_000)
    v_head_dim: int = Field(ge=1, le=100_000)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class ModelSpec(Strict):
    """A transformer: a decoder (causal attention, the default) or an encoder (``causal:
    false``, bidirectional attention, as BERT trains)."""

    name: str
    layers: int = Field(ge=1, le=100_000)
    hidden: int = Field(ge=1, le=10_000_000)
    heads: int = Field(ge=1, le=100_000)
    kv_heads: int = Field(ge=1, le=100_000)
    ffn_hidden: int = Field(ge=1, le=100_000_000)
    vocab: int = Field(ge=1, le=100_000_000)
    activation: Literal["swiglu", "gelu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    position: Literal["rope", "learned"] = "rope"
    tied_embeddings: bool = False
    max_seq_len: int = Field(default=8192, ge=1)
    head_dim: int = Field(default=0, ge=0, le=100_000)
    """Width of one attention head; 0 (the default) means hidden / heads. Qwen3's is not."""
    attention_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """The dropout on the attention probabilities the model trains with (Megatron-LM's
    `--attention-dropout`; 0, the default, for Llama-era models). Only unfused attention
    pays for it, as a kernel over the probabilities and a one-byte mask (flash attention
    applies it inside its kernel, or runs without)."""
    causal: bool = True
    """Whether a token attends only to those before it (a decoder, the default) or to the
    whole sequence (an encoder such as BERT: `false`). Flash attention skips the masked
    half of the score square only under a causal mask; unfused attention computes the
    whole square either way. Serving and context parallelism take causal models only."""
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    """Multi-head latent attention instead of grouped-query attention (kv_heads = heads)."""
    mtp_layers: int = Field(default=0, ge=0, le=64)
    """Multi-token-prediction modules after the last layer (DeepSeek-V3 trained with 1;
    arXiv 2412.19437 section 2.2): each one more layer of the model's last kind, a
    projection of the normed hidden state and next token's embedding (2 h to h) and a
    second pass of the shared LM head. Not part of ``layers`` or the parameter count."""
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _heads_consistent(self) -> ModelSpec:
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(
                    f"hidden {self.hidden} is not divisible by heads {self.heads}; "
                    "set head_dim to give the width of a head"
                )
            # Frozen model: fill the derived default in place, once, at validation.
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.mla is not None:
            if self.kv_heads != self.heads:
                raise ValueError(
                    "multi-head latent attention has a key and value per head: "
                    f"kv_heads must equal heads {self.heads}"
                )
            if self.head_dim != self.mla.v_head_dim:
                raise ValueError(
                    f"head_dim {self.head_dim} must equal mla.v_head_dim "
                    f"{self.mla.v_head_dim} (the width of a head's output)"
                )
        return self

    @property
    def blocks(self) -> int:
        """Transformer blocks the pipeline places: the layers, then the MTP modules'."""
        return self.layers + self.mtp_layers

    @property
    def qk_head_dim(self) -> int:
        """Width of a head's query and key: head_dim, or MLA's nope + rope parts."""
        return self.head_dim if self.mla is None else self.mla.qk_head_dim
