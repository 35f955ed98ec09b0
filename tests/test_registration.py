"""Importing the package adds the backend name "mxfp8" and changes nothing in Inductor; the first
use of an entry point registers the ops' decompositions, once."""

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil
import torch
import torch._inductor.config as config
import torch._inductor.decomposition as decomposition
from torch._dynamo.backends import registry

def state():
    return (dict(decomposition.decompositions), config.get_config_copy(),
            decomposition.fast_random_decomps.cache_info().currsize)

decomposition.fast_random_decomps()
before = state()
import mxfp8_inductor
for info in pkgutil.walk_packages(mxfp8_inductor.__path__, "mxfp8_inductor."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
after = state()
names = ("decompositions", "Inductor config", "fast_random_decomps")
for name, b, a in zip(names, before, after):
    assert a == b, f"importing the package changed {name}"

mxfp8_inductor.inductor_options()
added = set(decomposition.decompositions) - set(before[0])
assert {str(op) for op in added} == {f"mxfp8.{n}.default" for n in (
    "grouped_mm", "grouped_mm_input_grad", "grouped_mm_weight_grad", "linear", "linear_input_grad",
    "linear_weight_grad")}, added
assert "mxfp8" in torch._dynamo.list_backends(exclude_tags=())
assert decomposition.fast_random_decomps.cache_info().currsize == 0  # the stale cached table is dropped
print("ok")
"""


def test_import_changes_nothing_in_inductor_and_first_use_registers():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


# the backend name with the package on a plain path: its torch_dynamo_backends entry point hidden
PLAIN_PATH = r"""
import importlib.metadata as md

real = md.entry_points
def without_ours(**kwargs):
    eps = real(**kwargs)
    if kwargs.get("group") == "torch_dynamo_backends":
        return md.EntryPoints(ep for ep in eps if ep.name != "mxfp8")
    return eps
md.entry_points = without_ours

import torch
from torch._dynamo.utils import counters

x = torch.randn(64, 32, dtype=torch.bfloat16)
w = torch.randn(2, 32, 32, dtype=torch.bfloat16)
offs = torch.tensor([32, 64], dtype=torch.int32)
f = lambda x, w, offs: torch._grouped_mm(x, w, offs=offs)
try:
    torch.compile(f, backend="mxfp8")(x, w, offs)
except torch._dynamo.exc.InvalidBackend:
    pass
else:
    raise AssertionError("the name resolved with the entry point hidden and the package not imported")
torch._dynamo.reset()
import mxfp8_inductor
torch.compile(f, backend="mxfp8")(x, w, offs)
assert counters["inductor"]["mxfp8_forward_rewritten"] == 1, dict(counters["inductor"])
print("ok")
"""

# the installed entry point loads the package, whose import must leave the name to Dynamo
ENTRY_POINT_FIRST = r"""
import torch
from torch._dynamo.utils import counters

x = torch.randn(64, 32, dtype=torch.bfloat16)
w = torch.randn(2, 32, 32, dtype=torch.bfloat16)
torch.compile(lambda x, w, offs: torch._grouped_mm(x, w, offs=offs), backend="mxfp8")(
    x, w, torch.tensor([32, 64], dtype=torch.int32))
assert counters["inductor"]["mxfp8_forward_rewritten"] == 1, dict(counters["inductor"])
print("ok")
"""


def test_backend_name_works_from_a_plain_path():
    out = subprocess.run([sys.executable, "-c", PLAIN_PATH], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_backend_name_through_the_installed_entry_point():
    out = subprocess.run([sys.executable, "-c", ENTRY_POINT_FIRST], capture_output=True, text=True)
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
