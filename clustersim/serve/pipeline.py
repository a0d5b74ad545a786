"""Pipeline-parallel serving: a replica's layers split over ``pp`` stages of ``tp`` ranks.

A replica of ``tp x pp`` ranks holds its layers in ``pp`` stages (stage ``s`` on ranks
``s*tp .. (s+1)*tp - 1``, in the scenario's rank order, so a stage fills a node before
the next begins: vLLM's and TensorRT-LLM's multi-node layout, tensor parallel inside a
node and pipeline parallel across). An iteration runs every layer once, stage after
stage, and moves its activations across each stage boundary: vLLM sends the hidden
states and the residual (``IntermediateTensors``), each of the ``tp`` ranks its
``1/tp`` slice to the rank in the same place of the next stage
(``send_tensor_dict`` with ``all_gather_group``), all ``tp`` sends at once. Those
sends are timed by the project's network model on the replica's chips
(:class:`StageSends`, each distinct size once, as the TP all-reduces are); the
all-gather that reassembles the slices on the receiving stage is left out.

The stages work on ``pp`` batches at once: vLLM keeps ``pp`` virtual engines, each
with its own scheduler, ``max_num_seqs`` and ``1/pp`` of the KV blocks (vLLM's
``Scheduler`` divides ``num_gpu_blocks`` by the pipeline size), and a new request
goes to the one with the fewest unfinished requests. With the stages equally
loaded, each virtual engine's iteration takes the sum of the stages' times, the
same whether the other virtual engines are busy or idle (each stage serves them in
turn in that time), so a replica is simulated as ``pp`` independent virtual engines
with the whole model's iteration time plus the boundary sends. Unequal batches
across virtual engines, which would make one wait on a stage another still
occupies, are not modelled.
"""

from __future__ import annotations

import math

import numpy as np

from clustersim.errors import ScenarioError
from clustersim.network import Network
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import Resolved
from clustersim.scenario.serving import ServingCfg
from clustersim.serve.collectives import replica_network, replica_topology
from clustersim.serve.iteration import IterationModel
from clustersim.serve.requests import BLOCK_TOKENS

__all__ = ["ACTIVATION_TENSORS", "StageSends", "pipeline_problem", "virtual_engines"]

ACTIVATION_TENSORS = 2
"""What crosses a stage boundary per token: the hidden states and the residual
(vLLM's ``IntermediateTensors`` for Llama-style models), 16-bit each."""


class StageSends:
    """``self(rows)``: seconds an iteration of ``rows`` tokens spends sending its
    activations across the replica's ``pp - 1`` stage boundaries (module doc)."""

    def __init__(self, res: Resolved, tp: int, pp: int) -> None:
        self.tp, self.pp = tp, pp
        self.hidden = res.model.hidden
        ranks = tp * pp
        self.topology = replica_topology(res, ranks)
        self.runtime = runtime_of(res.chip, res.instance)
        self.rank_chip = [r // res.ranks_per_chip for r in range(ranks)]
        self.algorithms = dict(res.scenario.cluster.collectives)
        self._cache: dict[int, float] = {}
        self._net: Network | None = None

    def __call__(self, rows: int) -> float:
        if self.pp < 2 or rows <= 0:
            return 0.0
        cached = self._cache.get(rows)
        if cached is None:
            cached = self._cache[rows] = self._simulate(rows)
        return cached

    def _simulate(self, rows: int) -> float:
        if self._net is None:
            self._net = replica_network(
                self.topology, self.rank_chip, self.algorithms, self.runtime
            )
        env = self._net.env
        nbytes = ACTIVATION_TENSORS * rows * self.hidden * 2 / self.tp
        total = 0.0
        for stage in range(self.pp - 1):
            src = np.arange(stage * self.tp, (stage + 1) * self.tp)
            pairs = np.stack([src, src + self.tp], axis=1)
            start = env.now
            done = self._net.send(int(pairs[0, 0]), int(pairs[0, 1]), nbytes, replicas=pairs)
            env.run(until=done)
            total += float(env.now - start)
        return total


def virtual_engines(model: IterationModel, blocks: int, seq: int) -> tuple[int, int]:
    """KV blocks per engine and engines per replica: a pipeline-parallel replica runs
    ``pp`` virtual engines, each with ``1/pp`` of its blocks (module doc)."""
    if model.pp == 1:
        return blocks, 1
    share = blocks // model.pp
    if share < math.ceil(seq / BLOCK_TOKENS):
        raise ScenarioError(
            "parallelism.pp",
            model.pp,
            f"each of the {model.pp} virtual engines keeps {share * BLOCK_TOKENS:,} tokens of "
            f"KV, less than one {seq:,}-token request",
        )
    return share, model.pp


def pipeline_problem(res: Resolved, cfg: ServingCfg, pp: int) -> None:
    """Exit 2 where pipeline-parallel serving is not modelled (module doc)."""
    why = ""
    if cfg.engine == "neuron":
        why = "pipeline-parallel serving is modelled for the vllm and trtllm engines only"
    elif pp > res.model.layers:
        why = f"more stages than the model's {res.model.layers} layers"
    elif cfg.disaggregation is not None or cfg.speculative is not None:
        why = "not modelled with disaggregation or speculative decoding"
    elif res.scenario.failures.inject:
        why = "not modelled with failure injection"
    if why:
        raise ScenarioError("parallelism.pp", pp, why)
