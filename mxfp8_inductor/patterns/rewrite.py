"""Decide each grouped-matmul site and rewrite the eligible ones into `mxfp8::grouped_mm`.

The rewrite happens in the Dynamo graph, before AOTAutograd: the custom op carries its own
autograd, so the forward, input-gradient and weight-gradient GEMMs all become FP8 ops, and the
rewritten graph text (op present or not, its options) is part of every compile cache key.

Before (a routed-experts block as Dynamo captures it; the weight is a transposed parameter):

    w1_ENK = self.experts.w1                          # placeholder, a Parameter [E, N, K]
    w1_EKN = w1_ENK.transpose(-2, -1)
    h_MN = torch._grouped_mm(x_MK, w1_EKN, offs=offs_E)

After (one op per site; its backward computes the other two GEMMs, each in its own recipe):

    h_MN = torch.ops.mxfp8.grouped_mm(x_MK, w1_EKN, offs_E,
                                      "mxfp8:rceil", "mxfp8:rceil", "mxfp8:rceil",  # GemmSpecs: forward,
                                                                                    # input grad, weight grad
                                      None)   # the parameter keying reuse of w1's quantization (weight_cache)
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
import torch.fx
from torch._dynamo.utils import counters
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from .._warn import warn
from ..eligibility import static_dim
from ..lowering.auto import Plan, plan_for
from ..lowering.eager import linear_body
from ..lowering.ops import register_decompositions
from ..options import MXFP8Config
from ..spec import ROLES, Impl, op_args, site_specs
from .sites import Site, _val, find_sites

log = logging.getLogger("mxfp8_inductor")

# the block a shared weight rounding scales (kernels/shared_weight.py)
SHARED_BLOCK = {"mxfp8": "32x32 tiles", "fp8_rowwise": "one scale per expert"}

# set on grouped-matmul nodes already decided (kept in bf16), so a later pass leaves them alone
DECIDED = "mxfp8_decided"


@dataclasses.dataclass(frozen=True)
class SiteReport:
    """One GEMM of one call site: what the pass did with it and why."""

    module_fqn: str | None
    weight_fqn: str | None
    role: str
    action: str  # "rewritten", "excluded", "skipped", "kept bf16" or "not computed"
    reason: str
    node: str
    # what the GEMM runs: a `spec.Impl` value ("mxfp8", "fp8_rowwise", "fp8_blockwise", "bf16", or
    # chosen per call: "per_call", "per_call_timed"), or "-" (not run)
    impl: str


def _static(n) -> int | None:
    """A size's value when the graph is compiled for that value only; None for a dynamic size
    (whose example value the next calls need not share)."""
    return int(n) if is_concrete_int(n) else None


def _inductor_graphs() -> tuple[bool, bool]:
    """(CUDA graphs, graph partition) as the Inductor compiling this graph has them: its config
    while the pass runs (`mode="reduce-overhead"`, the backend's "inductor" patches)."""
    from torch._inductor import config as inductor

    return bool(inductor.triton.cudagraphs), bool(getattr(inductor, "graph_partition", False))


def _cuda_graphs(config: MXFP8Config) -> bool:
    """Whether the compiled graph's GEMMs run under CUDA graphs. Without graph partition a graph
    holding an op that reuses a weight is left out of them (docs/design.md, "Weight cache")."""
    graphs, partition = _inductor_graphs()
    return graphs and (partition or not config.weight_cache)


_warned_graphs = False


def _warn_graphs_off() -> None:
    """Once per process, for a graph with an op reusing a weight: where CUDA graphs are asked for
    without graph partition, that op keeps the graph out of them (Inductor only logs it)."""
    global _warned_graphs
    graphs, partition = _inductor_graphs()
    if _warned_graphs or not graphs or partition:
        return
    _warned_graphs = True
    warn("mxfp8: this graph runs without CUDA graphs: its GEMMs that reuse weights (weight_cache=True) run "
         "between graphs, which needs Inductor's graph_partition=True; set it, or weight_cache=False")


def plan(site: Site, config: MXFP8Config) -> Plan:
    """The recipe of each of the site's GEMMs (lowering/auto.py), as Inductor compiles them: the op
    decomposed, its activations' row quantization fused into their producers."""
    a, b = _val(site.a), _val(site.b)
    if site.dense:
        (N, K), E = (static_dim(n) for n in b.shape), 1
        M = _static(math.prod(a.shape[:-1]))  # the rows, counted: an empty K leaves none to divide
    else:
        E, K, N = (static_dim(n) for n in b.shape)
        M = _static(a.shape[0])
    return plan_for(config.recipe, config.wgrad, M=M, K=K, N=N, E=E, dense=site.dense, device=b.device,
                    autotune=config.autotune, rounding=config.rounding, cached=config.weight_cache, compiled=True,
                    graphs=_cuda_graphs(config))


def _param(site: Site, config: MXFP8Config) -> torch.fx.Node | None:
    """The parameter the site's op reuses the weight's quantization under, None for no reuse."""
    return site.param_node if config.weight_cache else None


def _replace(site: Site, config: MXFP8Config, impls: tuple[Impl, Impl, Impl],
             replaced: dict[torch.fx.Node, torch.fx.Node]) -> str:
    """Put the op in the site's place; `replaced` maps the nodes of sites replaced before to their
    ops, as a site's operands were recorded before (a grouped matmul fed by another)."""
    gm, node = site.gm, site.node
    param = _param(site, config)
    operands = (site.a, site.b, site.args.get("bias") if site.dense else site.offs)
    operands = tuple(replaced.get(x, x) if isinstance(x, torch.fx.Node) else x for x in operands)
    with gm.graph.inserting_before(node):
        target = linear_body if site.dense else torch.ops.mxfp8.grouped_mm.default
        # with fsdp_fp8_all_gather the op rounds the weight once for both GEMMs, as the FP8
        # all-gather delivers it (kernels/shared_weight.py)
        specs = site_specs(impls, rounding=config.rounding, reuse_weight=param is not None,
                           shared_weight=config.fsdp_fp8_all_gather and not site.dense, fused=config.mxfp8_fused,
                           dense=site.dense)
        new = gm.graph.call_function(target, (*operands, *op_args(specs), param))
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    replaced[node] = new
    return new.name


def _in_marked_module(site: Site) -> bool:
    stack = site.node.meta.get("nn_module_stack") or {}
    return any(hasattr(cls, "_mxfp8_base") for _, cls in stack.values() if isinstance(cls, type))


def _needs_grad(x) -> bool:
    val = _val(x)
    return not isinstance(val, torch.Tensor) or val.requires_grad


def _rows(site: Site, node_name: str, action: str, reason: str, config: MXFP8Config,
          site_plan: Plan | None) -> list[SiteReport]:
    rows = []
    for i, role in enumerate(ROLES):
        act, why = action, reason
        if site_plan is not None and config.recipe == "auto" and site_plan.impls[i] != Impl.BF16:
            why = f"{reason}; {site_plan.reasons[i]}"
        if action == "rewritten" and role != "forward" and not _needs_grad(site.node):
            act, why = "not computed", "the output needs no gradient (grad mode off, or no input requires one)"
        elif action == "rewritten" and role == "input-grad" and not _needs_grad(site.a):
            act, why = "not computed", "the tokens need no gradient"
        elif action == "rewritten" and role == "weight-grad" and not _needs_grad(site.b):
            act, why = "not computed", "the weight needs no gradient"
        elif action == "rewritten" and site_plan is not None and site_plan.impls[i] == Impl.BF16:
            act, why = "kept bf16", site_plan.reasons[i]
        elif action == "rewritten" and role != "weight-grad" and config.fsdp_fp8_all_gather and not site.dense:
            block = SHARED_BLOCK[config.recipe]
            why = f"{reason}; weight rounded once for both its GEMMs ({block}, fsdp_fp8_all_gather)"
        impl = site_plan.impls[i].value if act == "rewritten" else "-" if act == "not computed" else "bf16"
        rows.append(SiteReport(site.module_fqn, site.weight_fqn, role.value, act, why, node_name, impl))
    return rows


def decide(config: MXFP8Config, module_fqn: str | None, weight_fqn: str | None, *, dense: bool,
           output_projection: bool = False, filtered: bool = False) -> tuple[bool, str]:
    """Whether a site that passes its checks is rewritten, and why: the include/exclude rule, then
    the two defaults names cannot express (an output projection stays bf16 unless included by
    name; a module `filter_fn` refused stays bf16)."""
    ok, reason = config.matches(module_fqn, weight_fqn, dense)
    if ok and output_projection and not reason.startswith("included by"):
        return False, "kept bf16 by default (output projection: it computes the logits)"
    if ok and filtered:
        return False, "excluded by filter_fn"
    return ok, reason


def _action(site: Site, config: MXFP8Config) -> tuple[str, str]:
    problem = site.problem(config)
    if problem:
        return "skipped", problem
    filtered = site.marked is not None and site.marked.filtered and config is site.marked.config
    ok, reason = decide(config, site.module_fqn, site.weight_fqn, dense=site.dense,
                        output_projection=site.output_projection, filtered=filtered)
    return ("rewritten" if ok else "excluded"), reason


def _warn(sites: list[Site], config: MXFP8Config | None) -> None:
    """Options that cannot do what the user meant on this graph, and a graph with nothing to
    rewrite compiled with the backend."""
    if config is not None and not sites:
        what = "torch._grouped_mm or linear on a parameter weight" if config.targets == "all" else "torch._grouped_mm"
        warn(f"backend='mxfp8' found no {what} in the graph compiled here: nothing in it is rewritten (a dense "
             "model or block, or a graph break that left the experts elsewhere; mx.explain(model, *inputs) lists "
             "each graph and its sites)")
    elif config is not None:
        # FQNs here are relative to the compiled module: a per-block compile sees "moe.experts",
        # not "layers.0.moe.experts" (marking the model keeps them global)
        for message in config.unmatched((s.module_fqn, s.weight_fqn) for s in sites):
            warn(f"{message} in the graph compiled here (FQNs relative to the compiled module)")
    marked_elsewhere = {s.marked.config for s in sites if s.marked is not None and config is not None} - {config}
    if marked_elsewhere:
        warn("this model was marked with mxfp8(...) options that differ from the ones the compile passes "
             f"({sorted(c.key() for c in marked_elsewhere)} vs {config.key()}); the compile's options "
             "apply: compile a marked model with the default backend to use its own")
    if config is None and sites and not any(s.marked for s in sites) and any(map(_in_marked_module, sites)):
        warn("a marked model's grouped matmuls could not be matched to its parameters: they stay in bf16 "
             "(pass backend='mxfp8' with options to rewrite them regardless)")


def rewrite(gm: torch.fx.GraphModule, config: MXFP8Config | None) -> list[SiteReport]:
    """Rewrite `gm` in place; returns one row per (site, role).

    With `config=None` only sites whose weight belongs to a model marked with
    `mxfp8_inductor.mxfp8` are touched, each with its model's options (routed experts only).
    """
    register_decompositions()  # the graph may now hold the ops, which Inductor must decompose
    sites = find_sites(gm, dense=config is not None and config.targets == "all")
    _warn(sites, config)
    rows: list[SiteReport] = []
    touched: dict[int, torch.fx.GraphModule] = {}
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    reuses = False  # an op given a parameter: it runs outside CUDA graphs
    for site in sites:
        cfg = config if config is not None else site.marked.config if site.marked is not None else None
        if cfg is None or site.node.meta.get(DECIDED):
            continue
        action, reason = _action(site, cfg)
        site_plan = plan(site, cfg) if action == "rewritten" else None
        name = site.node.name
        if site_plan is None or site_plan.impls == (Impl.BF16,) * 3:  # auto may find FP8 slower for all three
            site.node.meta[DECIDED] = True
        else:
            name = _replace(site, cfg, site_plan.impls, replaced)
            touched[id(site.gm)] = site.gm
            reuses = reuses or _param(site, cfg) is not None
        rows += _rows(site, name, action, reason, cfg, site_plan)
    for module in touched.values():
        module.graph.lint()
        module.recompile()
    if reuses:
        _warn_graphs_off()
    for r in rows:
        counters["inductor"][f"mxfp8_{r.role}_{r.action}".replace(" ", "_").replace("-", "_")] += 1
        log.info("mxfp8: %s %s in %s, %s (%s): %s", r.role, r.action, r.impl, r.weight_fqn or r.module_fqn, r.node,
                 r.reason)
    return rows
