"""The custom ops the pass rewrites to (schemas, fakes, autograd), one module per recipe, and how
they decompose for Inductor."""

from .ops import grouped_mm, linear, register_decompositions
from .weights import clear_weight_cache

__all__ = ["clear_weight_cache", "grouped_mm", "linear", "register_decompositions"]
