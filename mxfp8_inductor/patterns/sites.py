"""Find routed-expert grouped matmuls in a Dynamo FX graph and say whether each can be rewritten.

Call forms (docs/design.md, "The pass"): `torch._grouped_mm` (what `F.grouped_mm` becomes), `aten._grouped_mm`
(packet or overload) and Hugging Face's `transformers::grouped_mm_fallback` (used when expert
weights are not bf16). The weight is followed back through transposes, casts and views to the
parameter it comes from, which gives its FQN.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import marks
from ..eligibility import dense_problem, site_problem
from ..options import MXFP8Config

_OP_NAMES = ("aten::_grouped_mm", "transformers::grouped_mm_fallback")
GROUPED_MM_FUNCTIONS = tuple(
    f for f in (torch._grouped_mm, getattr(torch.nn.functional, "grouped_mm", None)) if f is not None
)
LINEAR_FUNCTIONS = (torch._C._nn.linear, torch.nn.functional.linear)
_ARG_NAMES = {
    "a": ("mat_a", "self", "input"),
    "b": ("mat_b", "mat2", "weight"),
    "offs": ("offs",),
    "bias": ("bias",),
    "out_dtype": ("out_dtype",),
}
# methods and functions that keep the weight's identity: views, transposes, dtype casts, and a
# DTensor's local shard (TorchTitan's experts compute on `w.to_local()` under expert parallelism)
_PASS_THROUGH_METHODS = {
    "transpose", "permute", "t", "view", "reshape", "contiguous", "to", "bfloat16", "float", "type",
    "type_as", "detach", "view_as", "clone", "to_local",
}
_PASS_THROUGH_FUNCTIONS = {torch.transpose, torch.permute, torch.t, torch.reshape, torch.clone}
_SOURCE_KEY = re.compile(r"\['([^']*)'\]")


@dataclasses.dataclass
class Site:
    """One grouped matmul call, or with `dense` one linear on a parameter weight, in a graph (`gm`
    is the graph, or a subgraph of a higher-order op such as activation checkpointing, that
    holds it)."""

    gm: torch.fx.GraphModule
    node: torch.fx.Node
    a: Any
    b: Any
    offs: Any
    module_fqn: str | None
    weight_fqn: str | None
    param: torch.nn.Parameter | None
    marked: marks.Marked | None  # the weight's mark, when its model was marked
    args: dict[str, Any]  # the call's operands by role (grouped_mm_args)
    dense: bool = False
    # the node in `gm` holding the parameter itself, when the weight operand is read from a plain
    # (not subclass) parameter of its dtype: what keys reuse of the weight's quantization
    param_node: torch.fx.Node | None = None
    # a dense linear that computes the logits: its weight is tied to an input embedding, or it
    # maps the embedding's width to its vocabulary and its output meets no other matmul
    output_projection: bool = False

    def problem(self, config: MXFP8Config) -> str | None:
        """Why the config's op cannot run this call, None if it can."""
        if self.dense:
            return dense_problem(_val(self.a), _val(self.b), _val(self.args.get("bias")), config.recipe,
                                 config.dense_min_dim)
        return problem(self.args, config.recipe)


def linear_args(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The operands of an `F.linear` call by role: a (input), b (weight), bias."""
    out = dict(zip(("a", "b", "bias"), args))
    out.update({k: kwargs[n] for k, n in (("a", "input"), ("b", "weight"), ("bias", "bias")) if n in kwargs})
    return out


def is_grouped_mm(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in GROUPED_MM_FUNCTIONS:
        return True
    return _op_name(node.target) in _OP_NAMES


def _op_name(target: Any) -> str | None:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return None


def grouped_mm_args(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The operands of any grouped-matmul call form, by role: a, b, offs, bias, out_dtype."""
    out = dict(zip(("a", "b", "offs", "bias", "out_dtype"), args))
    for key, names in _ARG_NAMES.items():
        for name in names:
            if name in kwargs:
                out[key] = kwargs[name]
    return out


def problem(args: dict[str, Any], recipe: str) -> str | None:
    """Why the call with these operands (graph nodes or tensors) cannot be rewritten, or None."""
    return site_problem(*(_val(args.get(k)) for k in ("a", "b", "offs")), args.get("bias"), args.get("out_dtype"),
                        recipe)


def _val(x: Any) -> Any:
    if isinstance(x, torch.fx.Node):
        return x.meta.get("example_value", x.meta.get("val", x))  # the node itself when untraced
    return x


def _weight_source(b: Any, outer: dict[torch.fx.Node, Any]) -> torch.fx.Node | None:
    """The placeholder or get_attr node the weight operand is a view or cast of; `outer` maps a
    subgraph's placeholders to the operands of the enclosing call."""
    node = b
    while isinstance(node, torch.fx.Node):
        if node in outer:
            node = outer[node]
            continue
        if node.op in ("placeholder", "get_attr"):
            return node
        passes = (node.op == "call_method" and node.target in _PASS_THROUGH_METHODS) or (
            node.op == "call_function" and node.target in _PASS_THROUGH_FUNCTIONS
        ) or (node.op == "call_function" and _is_aten_view(node.target))
        if not passes or not node.args:
            return None
        node = node.args[0]
    return None


def _param_node(b: Any, outer: dict[torch.fx.Node, Any], param: torch.nn.Parameter | None) -> torch.fx.Node | None:
    """The node of b's own graph that holds `param` itself (not a view of it): the graph's
    placeholder or get_attr the weight is read from, where that is bound to the parameter
    directly; None for a subclass parameter (a DTensor), another dtype, or no such node."""
    if param is None or is_traceable_wrapper_subclass(param) or getattr(_val(b), "dtype", None) != param.dtype:
        return None
    node = b
    while isinstance(node, torch.fx.Node) and node.op not in ("placeholder", "get_attr"):
        passes = (node.op == "call_method" and node.target in _PASS_THROUGH_METHODS) or (
            node.op == "call_function" and (node.target in _PASS_THROUGH_FUNCTIONS or _is_aten_view(node.target)))
        if not passes or not node.args:
            return None
        node = node.args[0]
    bound = node
    while bound in outer:  # a subgraph's placeholder: bound to the parameter only through placeholders
        bound = outer[bound]
        if not isinstance(bound, torch.fx.Node) or bound.op not in ("placeholder", "get_attr"):
            return None
    return node if isinstance(node, torch.fx.Node) else None


def _is_aten_view(target: Any) -> bool:
    name = _op_name(target) or ""
    return name in ("aten::transpose", "aten::permute", "aten::t", "aten::view", "aten::_to_copy", "aten::clone")


def _source_fqn(source_name: str) -> str | None:
    """`L['self']._modules['a']._parameters['w']` -> `a.w` (relative to the compiled frame)."""
    keys = _SOURCE_KEY.findall(source_name)
    return ".".join(keys[1:]) if len(keys) > 1 else None


def _stack_fqn(node: torch.fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    path = re.sub(r"\[['\"]?([^'\"\]]*)['\"]?\]", r".\1", path)  # layers[0] / ['0'] -> .0
    parts = [p for p in path.split(".") if p]
    return ".".join(parts[1:])  # drop the frame root (L['self'] / self)


def _fqns(
    node: torch.fx.Node, b: Any, outer: dict[torch.fx.Node, Any], table: dict
) -> tuple[str | None, str | None, torch.nn.Parameter | None, marks.Marked | None]:
    """(module FQN, weight FQN, parameter, mark): global when the model was marked, else relative
    to the compiled module; `table` is a `marks.marked_params()` snapshot."""
    src = _weight_source(b, outer)
    param = None
    weight_fqn = None
    if src is not None and src.op == "placeholder":
        grapharg = src.meta.get("grapharg")
        example = getattr(grapharg, "example", None)
        if isinstance(example, torch.nn.Parameter):
            param = example
        if grapharg is not None and getattr(grapharg, "source", None) is not None:
            weight_fqn = _source_fqn(grapharg.source.name)
    elif src is not None:
        weight_fqn = str(src.target)
    marked = marks.lookup(param, table) if param is not None else None
    if marked is not None:
        weight_fqn = marked.fqn
    if weight_fqn and "." in weight_fqn:
        module_fqn = weight_fqn.rsplit(".", 1)[0]
    elif weight_fqn:
        module_fqn = ""
    else:
        module_fqn = _stack_fqn(node)
    return module_fqn, weight_fqn, param, marked


_EMBEDDINGS = {torch.nn.functional.embedding: 1, torch.embedding: 0}  # function -> weight position
# calls past which a linear's output is no longer logits
_MATMULS = {torch.matmul, torch.bmm, torch.mm, torch.nn.functional.scaled_dot_product_attention, torch.einsum,
            *LINEAR_FUNCTIONS, *GROUPED_MM_FUNCTIONS}


def _embeddings(gm: torch.fx.GraphModule, outer: dict[torch.fx.Node, Any]) -> list[torch.Tensor]:
    """The weights of the input embeddings called in the graph."""
    out = []
    for node in gm.graph.nodes:
        pos = _EMBEDDINGS.get(node.target) if node.op == "call_function" else None
        if pos is not None and len(node.args) > pos:
            src = _weight_source(node.args[pos], outer)
            example = getattr(src.meta.get("grapharg"), "example", None) if src is not None else None
            if isinstance(example, torch.Tensor) and example.dim() == 2:
                out.append(example)
    return out


def _reaches_output_unmultiplied(node: torch.fx.Node) -> bool:
    """Whether the node's value reaches the graph's output through no further matmul."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        for user in n.users:
            if user.op == "output":
                return True
            if user not in seen and not (user.op == "call_function" and user.target in _MATMULS):
                seen.add(user)
                todo.append(user)
    return False


def _is_output_projection(node: torch.fx.Node, param: torch.Tensor, embeddings: list[torch.Tensor]) -> bool:
    for emb in embeddings:
        if emb.untyped_storage().data_ptr() == param.untyped_storage().data_ptr():
            return True  # tied to the input embedding
        if tuple(param.shape) == tuple(emb.shape) and _reaches_output_unmultiplied(node):
            return True  # hidden -> vocabulary, into the output
    return False


def _flat_nodes(args: Any) -> list[Any]:
    out = []
    for a in args:
        out += _flat_nodes(a) if isinstance(a, (list, tuple)) else [a]
    return out


def find_sites(
    gm: torch.fx.GraphModule, dense: bool = True, outer: dict[torch.fx.Node, Any] | None = None,
    table: dict | None = None,
) -> list[Site]:
    """Every grouped matmul call in the graph and in the subgraphs of its higher-order ops
    (activation checkpointing wraps the MoE block in one), in graph order; with `dense`, also
    every linear on a parameter weight."""
    outer = outer or {}
    table = marks.marked_params() if table is None else table
    embeddings = _embeddings(gm, outer) if dense else []
    sites = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            args = _flat_nodes(node.args)
            for i, arg in enumerate(args):
                sub = getattr(gm, arg.target, None) if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" else None
                if isinstance(sub, torch.fx.GraphModule):
                    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
                    operands = [a for a in args[i + 1:] if not (isinstance(a, torch.fx.Node) and a.op == "get_attr")]
                    sites += find_sites(sub, dense, {**outer, **dict(zip(placeholders, operands))}, table)
        if dense and node.op == "call_function" and node.target in LINEAR_FUNCTIONS:
            dense_args = linear_args(node.args, node.kwargs)
            module_fqn, weight_fqn, param, marked = _fqns(node, dense_args.get("b"), outer, table)
            if param is not None:
                sites.append(Site(gm, node, dense_args["a"], dense_args["b"], None, module_fqn, weight_fqn,
                                  param, marked, dense_args, dense=True,
                                  param_node=_param_node(dense_args["b"], outer, param),
                                  output_projection=_is_output_projection(node, param, embeddings)))
            continue
        if not is_grouped_mm(node):
            continue
        args = grouped_mm_args(node.args, node.kwargs)
        module_fqn, weight_fqn, param, marked = _fqns(node, args.get("b"), outer, table)
        sites.append(Site(gm, node, args.get("a"), args.get("b"), args.get("offs"), module_fqn, weight_fqn,
                          param, marked, args, param_node=_param_node(args.get("b"), outer, param)))
    return sites
