"""The package's public names."""

from __future__ import annotations

from clustersim import workload


def test_all_names_resolve() -> None:
    assert len(set(workload.__all__)) == len(workload.__all__)
    for name in workload.__all__:
        assert hasattr(workload, name), name
    for name in ("Layout", "build_programs", "check_fits", "memory_per_rank", "validate"):
        assert name in workload.__all__
