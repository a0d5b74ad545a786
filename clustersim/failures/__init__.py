"""Failures: injection inside a step simulation, and the long-horizon reliability model."""

__all__: list[str] = []
