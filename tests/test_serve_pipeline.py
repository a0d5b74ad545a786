"""Pipeline-parallel serving: stage memory, boundary sends and virtual engines."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.serve.pipeline import ACTIVATION_TENSORS, StageSends
from clustersim.serve.run import iteration_model, serve, serving_of


def scenario(tp: int, pp: int, count: int = 2, engine: str = "vllm", extra: str = "") -> str:
    return (
        f"name: pp\ncluster: {{instance: p5.48xlarge, count: {count}}}\nmodel: llama3-70b\n"
        f"parallelism: {{tp: {tp}, pp: {pp}}}\n{extra}serving:\n  engine: {engine}\n"
        "  arrival: {kind: poisson, rate_per_s: 4}\n  requests: 120\n"
        "  input_tokens: 512\n  output_tokens: 64\n"
    )


def test_a_stage_holds_its_share_of_the_layers_and_kv() -> None:
    one = load_scenario(scenario(8, 1, count=1))
    two = load_scenario(scenario(8, 2))
    m1 = iteration_model(one, serving_of(one))
    m2 = iteration_model(two, serving_of(two))
    lm_head = m1.shapes.lm_head_bytes
    layers = m1.weight_bytes_per_rank - 2 * lm_head
    assert m2.weight_bytes_per_rank == pytest.approx(layers * 40 / 80 + lm_head, rel=1e-12)
    assert m2.kv_bytes_per_token_per_rank == m1.kv_bytes_per_token_per_rank / 2


def test_an_iteration_adds_its_boundary_sends_to_the_whole_models_time() -> None:
    one = load_scenario(scenario(8, 1, count=1))
    two = load_scenario(scenario(8, 2))
    m1 = iteration_model(one, serving_of(one))
    m2 = iteration_model(two, serving_of(two))
    assert m2.stage_send_s is not None
    for chunks, decodes, context in (((), 16, 9000), (((512, 0),), 3, 1500)):
        rows = decodes + sum(c for c, _ in chunks)
        expected = m1.iteration_s(chunks, decodes, context) + m2.stage_send_s(rows)
        assert m2.iteration_s(chunks, decodes, context) == expected


def test_stage_sends_cross_each_boundary_in_turn() -> None:
    """Three stages on three p5 nodes cross two alike boundaries: twice one boundary."""
    res = load_scenario(scenario(8, 3, count=3))
    sends = StageSends(res, 8, 3)
    two = StageSends(load_scenario(scenario(8, 2)), 8, 2)
    for rows in (1, 64, 4096):
        assert sends(rows) == pytest.approx(2 * two(rows), rel=1e-9)
    # each rank sends its 1/tp slice of the hidden states and the residual: past the
    # latency, time grows with the bytes
    big, bigger = two(8192), two(16384)
    assert bigger > big > two(1) > 0
    nbytes = ACTIVATION_TENSORS * 8192 * res.model.hidden * 2 / 8
    assert bigger - big < 2 * nbytes / 1e9  # at well over 1 GB/s a rank across EFA
    assert StageSends(res, 8, 1)(100) == 0.0


def test_a_pipelined_replica_runs_pp_virtual_engines() -> None:
    res = load_scenario(scenario(8, 2))
    s = serve(res)
    assert (s.summary["replicas"], s.summary["pp"]) == (1, 2)
    assert set(s.requests["replica"]) == {0, 1}  # vLLM's virtual engines
    assert s.summary["requests_finished"] == 120
    flat = serve(load_scenario(scenario(8, 1, count=1))).summary
    assert flat["pp"] == 1


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (scenario(8, 2, engine="neuron"), "vllm and trtllm engines only"),
        (scenario(1, 100, count=13), "more stages than the model's 80 layers"),
        (
            scenario(8, 2, extra="failures: {inject: [{at: 1s, target: {chip: 0}, kind: down}]}\n"),
            "failure injection",
        ),
        (scenario(8, 4), "more than the cluster's 16 ranks"),
    ],
)
def test_pipeline_layouts_not_modelled_exit_2(text: str, match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        serve(load_scenario(text))
