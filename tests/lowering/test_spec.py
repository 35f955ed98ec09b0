"""One typed spec per GEMM from the pass to the kernel (`mxfp8_inductor/spec.py`): its text form
round-trips, and every option of `MXFP8Config` reaches the implementation that runs the GEMM, in
the eager op, under the pass, and through a choice made per call."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import make_offs

import mxfp8_inductor as mx
from mxfp8_inductor.lowering import dispatch
from mxfp8_inductor.spec import ROLES, GemmSpec, Impl, Role

SIZES = [16, 0, 24, 24]


@pytest.mark.parametrize("impl", list(Impl))
@pytest.mark.parametrize("flags", [(False, False, False), (True, False, True), (False, True, False)])
@pytest.mark.parametrize("role, dense", [(Role.FORWARD, False), (Role.WEIGHT_GRAD, True)])
def test_a_spec_round_trips_through_its_text(impl, flags, role, dense):
    spec = GemmSpec(role, impl, "floor", *flags, dense=dense)
    assert GemmSpec.decode(spec.encode(), role, dense) == spec


@pytest.mark.parametrize("text", ["fp8_rowwise", "fp8_rowwise:rceil+cached", "auto:rceil", "mxfp8:rceil+fused+x",
                                  "mxfp8:ceil"])
def test_a_malformed_spec_names_the_form(text):
    with pytest.raises(ValueError, match="malformed GEMM spec|unknown GEMM implementation|unknown rounding"):
        GemmSpec.decode(text, Role.FORWARD, False)


class Block(torch.nn.Module):
    """A dense linear, then routed experts through a transposed weight, as models write them."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.proj = torch.nn.Linear(64, 64, bias=False).bfloat16()
        self.w_ENK = torch.nn.Parameter(torch.randn(len(SIZES), 64, 64, generator=g).bfloat16() / 8)

    def forward(self, x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(self.proj(x_MK), self.w_ENK.transpose(-2, -1), offs=offs)


@pytest.fixture
def seen(monkeypatch):
    """Every spec an implementation is asked to run, as it reaches it; compiled graphs are built
    anew (a cached one would run without asking)."""
    specs: list[GemmSpec] = []
    real = dispatch.method
    monkeypatch.setattr(dispatch, "method", lambda spec: (specs.append(spec), real(spec))[1])
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(
            enable_autograd_cache=False):
        yield specs


def _step(run, x_MK: torch.Tensor, offs: torch.Tensor) -> None:
    x_MK = x_MK.detach().requires_grad_()
    run(x_MK, offs).float().square().sum().backward()


def _inputs(rows: int = sum(SIZES)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 64, generator=g).bfloat16(), make_offs([rows - 48, 0, 24, 24])


def _by_role(specs: list[GemmSpec], dense: bool) -> dict[Role, set[GemmSpec]]:
    return {role: {s for s in specs if s.role is role and s.dense == dense} for role in ROLES}


def test_the_eager_ops_options_reach_each_gemm(seen):
    x, offs = _inputs()
    w = torch.nn.Parameter(torch.randn(4, 64, 64).bfloat16())
    _step(lambda x, o: mx.grouped_mm(x, w.transpose(-2, -1), o, recipe="fp8_rowwise", rounding="floor",
                                     wgrad="bf16", weight_cache=True), x, offs)
    assert set(seen) == {GemmSpec(Role.FORWARD, Impl.FP8_ROWWISE, "floor", reuse_weight=True),
                         GemmSpec(Role.INPUT_GRAD, Impl.FP8_ROWWISE, "floor", reuse_weight=True),
                         GemmSpec(Role.WEIGHT_GRAD, Impl.BF16, "floor")}


def test_the_pass_carries_every_option_to_each_gemm(seen):
    """Under Inductor (the GEMMs decomposed at compile time): recipe, rounding, wgrad,
    weight_cache, mxfp8_fused and targets, on the grouped GEMM and the dense linear."""
    torch._dynamo.reset()
    options = {"recipe": "mxfp8", "rounding": "floor", "wgrad": "bf16", "weight_cache": True, "mxfp8_fused": True,
               "targets": "all", "dense_min_dim": 0}
    _step(torch.compile(Block(), backend="mxfp8", options=options), *_inputs())
    for dense in (False, True):
        flags = {"rounding": "floor", "fused": True, "dense": dense}
        assert _by_role(seen, dense) == {
            Role.FORWARD: {GemmSpec(Role.FORWARD, Impl.MXFP8, reuse_weight=True, **flags)},
            Role.INPUT_GRAD: {GemmSpec(Role.INPUT_GRAD, Impl.MXFP8, reuse_weight=True, **flags)},
            Role.WEIGHT_GRAD: {GemmSpec(Role.WEIGHT_GRAD, Impl.BF16, **flags)}}, dense


def test_a_choice_made_per_call_keeps_every_other_option(seen):
    """A dynamic token count leaves "auto"'s choice to each call: the spec the implementation
    runs is the chosen one with the pass's rounding, reuse and mxfp8_fused flags."""
    torch._dynamo.reset()
    options = {"recipe": "auto", "autotune": False, "rounding": "floor", "weight_cache": True, "mxfp8_fused": True}
    run = torch.compile(Block(), backend="mxfp8", options=options)
    x, offs = _inputs()
    x = x.requires_grad_()
    torch._dynamo.mark_dynamic(x, 0)
    run(x, offs).float().square().sum().backward()
    grouped = [s for s in seen if not s.dense]
    assert {s.role for s in grouped} == set(ROLES)
    for s in grouped:
        assert not s.impl.deferred and s.rounding == "floor" and s.fused
        assert s.reuse_weight == (s.role is not Role.WEIGHT_GRAD)


def test_fsdp_fp8_all_gather_rounds_the_weight_once_for_both_its_gemms(seen):
    """Marking with fsdp_fp8_all_gather (no FSDP2 needed) gives both weight GEMMs the shared
    weight rounding, under the default backend."""
    torch._dynamo.reset()
    model = Block()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mx.mxfp8(model, recipe="fp8_rowwise", fsdp_fp8_all_gather=True)
    _step(torch.compile(model), *_inputs())
    assert {(s.role, s.shared_weight) for s in seen} == {(Role.FORWARD, True), (Role.INPUT_GRAD, True),
                                                         (Role.WEIGHT_GRAD, False)}
