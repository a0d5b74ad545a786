"""Closed-loop clients: when they start, and what starting them spread does to TTFT."""

from __future__ import annotations

import numpy as np
import pytest
from serve_helpers import Fixed

from clustersim.scenario import load_scenario
from clustersim.serve.run import closed_loop_ramp_s, iteration_model, serve, serving_of
from clustersim.serve.sim import ServeSim


def p5(serving: str, model: str = "llama3-8b", tp: int = 1) -> str:
    return (
        f"name: closed\ncluster: {{instance: p5.48xlarge}}\nmodel: {model}\n"
        f"parallelism: {{tp: {tp}}}\nserving: {{{serving}}}\n"
    )


def test_clients_start_at_seeded_uniform_times_within_the_ramp() -> None:
    def starts(seed: int) -> list[float]:
        sim = ServeSim(
            [Fixed(1.0, 1.0)], engine="vllm", max_num_seqs=8, max_num_batched_tokens=10_000,
            kv_blocks=10_000, requests=4, input_tokens=10, output_tokens=10,
            arrival=("closed", 4), seed=seed, ramp_s=3.0,
        )  # fmt: skip
        return sorted(r.arrival for r in sim.run())

    expected = sorted(np.random.default_rng([7, 4]).uniform(0.0, 3.0, 4).tolist())
    assert starts(7) == pytest.approx(expected, abs=1e-12)
    assert starts(7) == starts(7) and starts(7) != starts(8)
    assert all(0.0 <= t < 3.0 for t in starts(7))


def test_the_default_ramp_is_one_request_with_every_client_in_flight() -> None:
    res = load_scenario(
        p5("arrival: {kind: closed, concurrency: 6}, requests: 12, max_num_seqs: 4, "
           "input_tokens: 100, output_tokens: 11")
    )  # fmt: skip
    cfg = serving_of(res)
    # 6 clients over 2 replicas: 3 decode together; the prompt alone, then 10 steps
    assert closed_loop_ramp_s(cfg, Fixed(0.2, 0.03), 2, 100.0, 11.0) == pytest.approx(0.5)
    # a model-backed estimate: the prompt's iteration plus the decode steps
    model = iteration_model(res, cfg)
    step = model.iteration_s((), 4, 4 * (100 + 5))
    ramp = closed_loop_ramp_s(cfg, model, 1, 100.0, 11.0)
    assert ramp == pytest.approx(model.iteration_s(((100, 0),)) + 10 * step)


@pytest.mark.parametrize(
    ("serving", "ramp"),
    [
        ("arrival: {kind: closed, concurrency: 6, ramp_s: 0}", 0.0),
        ("arrival: {kind: closed, concurrency: 6, ramp_s: 2.5}", 2.5),
        ("arrival: {kind: closed, concurrency: 6}, batching: static", 0.0),
        ("arrival: {kind: closed, concurrency: 1}", 0.0),
        ("arrival: {kind: poisson, rate_per_s: 3}", 0.0),
    ],
)
def test_the_ramp_is_left_out_where_clients_start_together(serving: str, ramp: float) -> None:
    cfg = serving_of(load_scenario(p5(serving + ", requests: 12")))
    assert closed_loop_ramp_s(cfg, Fixed(0.2, 0.03), 1, 100.0, 11.0) == ramp


def test_desynchronised_clients_wait_for_one_prompt_not_for_all() -> None:
    """All at once, eight 1,024-token prompts are prefilled in one iteration and every
    first token waits for all eight; spread over a request's time, each prompt is
    prefilled as it comes, beside the others' decodes."""
    text = p5(
        "engine: vllm, precision: fp8, weight_dtype: fp8, max_num_seqs: 8, replicas: 1, "
        "requests: 32, "
        "input_tokens: 1024, output_tokens: 256, arrival: {kind: closed, concurrency: 8RAMP}",
        model="llama3-70b", tp=4,
    )  # fmt: skip
    together = serve(load_scenario(text.replace("RAMP", ", ramp_s: 0"))).summary
    spread = serve(load_scenario(text.replace("RAMP", ""))).summary
    res = load_scenario(text.replace("RAMP", ""))
    model = iteration_model(res, serving_of(res))
    one, eight = model.iteration_s(((1024, 0),)), model.iteration_s(((1024, 0),) * 8)
    assert together["ttft_s"]["p50"] == pytest.approx(eight, rel=1e-9)
    assert one <= spread["ttft_s"]["p50"] < 0.5 * eight
