"""The package version, in a leaf module: readers of results (reports, the result
store) stamp it without importing the package root or the simulator."""

__version__ = "0.1.0"
