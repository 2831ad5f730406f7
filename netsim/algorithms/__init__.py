"""Algorithms: one file per family, each reading like its paper's pseudo-code."""

from netsim.algorithms.registry import REGISTRY, load_plugin, names, register, resolve

__all__ = ["REGISTRY", "load_plugin", "names", "register", "resolve"]
