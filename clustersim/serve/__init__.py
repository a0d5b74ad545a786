"""Inference serving: iteration times from the chip and network models, a request-level
SimPy simulation of engine schedulers (vLLM, Neuron), and ``clustersim serve``."""
