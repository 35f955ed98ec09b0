"""The custom ops the pass rewrites to (schemas, fakes, autograd), one module per recipe, and how
they decompose for Inductor."""

from .ops import grouped_mm, linear, register_decompositions

__all__ = ["grouped_mm", "linear", "register_decompositions"]
