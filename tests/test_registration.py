"""Importing the package changes nothing in torch or Inductor; the first use of an entry point
registers the ops' decompositions and the backend name, once."""

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil
import torch
import torch._inductor.config as config
import torch._inductor.decomposition as decomposition
from torch._dynamo.backends import registry

def state():
    return (dict(decomposition.decompositions), config.get_config_copy(), "mxfp8" in registry._COMPILER_FNS,
            decomposition.fast_random_decomps.cache_info().currsize)

decomposition.fast_random_decomps()
before = state()
import mxfp8_inductor
for info in pkgutil.walk_packages(mxfp8_inductor.__path__, "mxfp8_inductor."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
after = state()
names = ("decompositions", "Inductor config", "the Dynamo backend names", "fast_random_decomps")
for name, b, a in zip(names, before, after):
    assert a == b, f"importing the package changed {name}"

mxfp8_inductor.inductor_options()
added = set(decomposition.decompositions) - set(before[0])
assert {str(op) for op in added} == {f"mxfp8.{n}.default" for n in (
    "grouped_mm", "grouped_mm_dgrad", "grouped_mm_wgrad", "linear", "linear_dgrad", "linear_wgrad")}, added
assert "mxfp8" in torch._dynamo.list_backends(exclude_tags=())
assert decomposition.fast_random_decomps.cache_info().currsize == 0  # the stale cached table is dropped
print("ok")
"""


def test_import_changes_nothing_and_first_use_registers():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_rewrites_are_counted_in_inductor_counters():
    import torch
    from torch._dynamo.utils import counters

    import mxfp8_inductor as mx

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(2, 64, 32, dtype=torch.bfloat16))

        def forward(self, x, offs):
            return torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs)

    counters.clear()
    x = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    mx.explain(Experts(), x, torch.tensor([32, 64], dtype=torch.int32))
    assert {k: v for k, v in counters["inductor"].items() if k.startswith("mxfp8")} == {
        "mxfp8_forward_rewritten": 1, "mxfp8_input_grad_rewritten": 1, "mxfp8_weight_grad_rewritten": 1}


EAGER_OP_UNDER_COMPILE = r"""
import torch
import torch._inductor.decomposition as decomposition
import mxfp8_inductor as mx

a = torch.randn(64, 32, dtype=torch.bfloat16)
w = torch.randn(2, 32, 32, dtype=torch.bfloat16)
offs = torch.tensor([32, 64], dtype=torch.int32)
f = torch.compile(lambda a, w, o: mx.grouped_mm(a, w, o), fullgraph=True, backend="eager")
f(a, w, offs)
assert torch.ops.mxfp8.grouped_mm.default in decomposition.decompositions
print("ok")
"""


def test_the_eager_op_in_a_compiled_caller_registers_its_decompositions():
    """No entry point ran: the op's trace registers them (Inductor must find them to fuse it)."""
    out = subprocess.run([sys.executable, "-c", EAGER_OP_UNDER_COMPILE], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
