"""Wall time vs GPU kernel time per compiled MoE-block training step, and the top CUDA kernels:

    python benchmarks/profile_moe_block.py qwen3_30b:mxfp8 qwen3_30b:fp8_rowwise fine64:bf16

Wall time well above kernel time means the step is bound by host work (Python, launches).
"""
import os, sys, time, torch
sys.path.insert(0, "."); sys.path.insert(0, "examples"); sys.path.insert(0, "benchmarks")
import mxfp8_inductor  # noqa
from shapes import block_and_inputs
from torch.profiler import profile, ProfilerActivity
TOPK = int(os.environ.get("TOPK", 16))  # kernels listed per profile
for arg in sys.argv[1:]:
    shape, recipe = arg.split(":")
    torch._dynamo.reset()
    block, x, counts, grad = block_and_inputs(shape)
    fn = torch.compile(block, backend="mxfp8", options={"recipe": recipe}) if recipe != "bf16" else torch.compile(block)
    def step():
        out = fn(x, counts); out.backward(grad)
    for _ in range(3): step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10): step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / 10 * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): step()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    tot = sum(k.device_time_total for k in ka) / 5 / 1e3
    print(f"==== {shape} {recipe}: wall {wall:.3f} ms/step, kernels {tot:.3f} ms/step", flush=True)
    for k in sorted(ka, key=lambda k: -k.device_time_total)[:TOPK]:
        print(f"{k.device_time_total/5/1e3:8.3f} ms {k.count//5:3d}x {k.key[:110]}")
