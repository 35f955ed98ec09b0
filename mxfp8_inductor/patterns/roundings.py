"""Post-grad pass: a tensor rounded to MXFP8 both ways in one graph is read once.

The backward graph of every rewritten GEMM rounds its incoming gradient along K for the input
gradient (`mxfp8::quantize_dequantize`, dim -1) and per token group for the weight gradient
(`mxfp8::quantize_dequantize_groups`). The two calls come from two decompositions, so only a pass
over the partitioned graph sees both; it replaces such a pair with
`mxfp8::quantize_dequantize_rows_and_groups`, which writes both results from one read.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..lowering import ops

_ROWS = ops.quantize_dequantize_op
_GROUPS = ops.quantize_dequantize_groups_op
_BOTH = ops.quantize_dequantize_rows_and_groups_op


def _is_2d(node: torch.fx.Node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 2


def fuse_roundings(graph: torch.fx.Graph) -> int:
    """Replace each (rows, groups) rounding pair of one 2-D tensor with one call; returns the
    number of pairs fused."""
    rows: dict[tuple, list[torch.fx.Node]] = {}
    groups: dict[tuple, list[torch.fx.Node]] = {}
    for n in graph.nodes:
        if n.op != "call_function" or n.kwargs:
            continue
        if n.target is _ROWS and n.args[1] in (-1, 1) and _is_2d(n.args[0]):
            rows.setdefault((n.args[0], n.args[2]), []).append(n)
        elif n.target is _GROUPS:
            groups.setdefault((n.args[0], n.args[1], n.args[2]), []).append(n)
    order = {n: i for i, n in enumerate(graph.nodes)}
    fused = 0
    for (x, offs, rounding), group_nodes in groups.items():
        row_nodes = rows.pop((x, rounding), None)
        if not row_nodes:
            continue
        with graph.inserting_before(min(row_nodes + group_nodes, key=order.__getitem__)):
            both = graph.call_function(_BOTH, (x, offs, rounding))
            outs = [graph.call_function(operator.getitem, (both, i)) for i in range(2)]
        fake_mode = getattr(x.meta.get("val"), "fake_mode", None)
        if fake_mode is not None and "val" in offs.meta:
            with fake_mode:
                both.meta["val"] = _BOTH(x.meta["val"], offs.meta["val"], rounding)
            for i, out in enumerate(outs):
                out.meta["val"] = both.meta["val"][i]
        for out, old_nodes in zip(outs, (row_nodes, group_nodes)):
            for n in old_nodes:
                n.replace_all_uses_with(out)
                graph.erase_node(n)
        fused += 1
    return fused
