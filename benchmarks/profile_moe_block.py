"""Top CUDA kernels of 5 compiled MoE-block training steps: `python benchmarks/profile_moe_block.py dsv3 fp8_rowwise`."""
import sys, torch, copy
sys.path.insert(0, "."); sys.path.insert(0, "examples"); sys.path.insert(0, "benchmarks")
import mxfp8_inductor  # noqa
from moe_model import GroupedExperts
from shapes import SHAPES, TOKENS, uneven_counts
from torch.profiler import profile, ProfilerActivity
shape, recipe = sys.argv[1], sys.argv[2]
E, D, F = SHAPES[shape]
torch.manual_seed(0)
block = GroupedExperts(E, D, F).cuda().bfloat16()
x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
counts = uneven_counts(E, TOKENS); grad = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
fn = torch.compile(block, backend="mxfp8", options={"recipe": recipe}) if recipe != "bf16" else torch.compile(block)
def step():
    out = fn(x, counts); out.backward(grad)
for _ in range(3): step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5): step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
