"""Layout search: which parallel layout trains a model fastest, or cheapest, on N chips.

``space`` enumerates the layouts and checks them against the model and HBM,
``estimate`` times each in closed form (milliseconds per layout), and ``run``
simulates the best candidates and ranks them. ``clustersim search`` is the CLI.
"""

from clustersim.search.estimate import Estimate, Estimator, NetModel, estimate
from clustersim.search.run import (
    FOLD_ABOVE_RANKS,
    OBJECTIVES,
    SearchResult,
    resize,
    search,
    write_search,
)
from clustersim.search.space import Candidate, chip_memory_bytes, enumerate_layouts, layouts_of

__all__ = [
    "FOLD_ABOVE_RANKS",
    "OBJECTIVES",
    "Candidate",
    "Estimate",
    "Estimator",
    "NetModel",
    "SearchResult",
    "chip_memory_bytes",
    "enumerate_layouts",
    "estimate",
    "layouts_of",
    "resize",
    "search",
    "write_search",
]
