"""Host time of the launch routes in a real training step: microseconds per quantizer call (a
512x512 input), then examples/train_moe.py's model (forward + backward, no optimizer) per recipe
with our kernels launched through Triton's own path ("triton"), `launch` ("cached") or
`launch_keyed` ("bound"),
in one process: wall per step (3 rounds of 20) and the CUDA kernel time per step.

    python benchmarks/probe_launch_train_step.py > benchmarks/results/launch_train_step_h200.txt

(When the committed results were measured, `us_launch_only` passed `x.view(1, 512, 512)` views;
`_launch_quant` has taken `_view3` geometry since.)
"""
import os, sys, time, json
sys.path.insert(0, "."); sys.path.insert(0, "examples"); sys.path.insert(0, "benchmarks")
import torch
import mxfp8_inductor  # noqa
from mxfp8_inductor.lowering import ops
from mxfp8_inductor.kernels import triton_mx
from torch.profiler import profile, ProfilerActivity
from bench_launch import use_route, us_per_call as per_call
res = {}
dev = "cuda" if torch.cuda.is_available() else "cpu"

x = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
offs = torch.tensor([100, 300, 512], device=dev, dtype=torch.int32)
y = torch.empty_like(x)
res["us_empty_like"] = per_call(lambda: torch.empty_like(x))
res["us_op_qdq"] = per_call(lambda: ops.quantize_dequantize_op(x, -1, "rceil"))
res["us_py_qdq"] = per_call(lambda: triton_mx.quantize_dequantize(x, -1, "rceil", torch.bfloat16))
res["us_op_qdq_groups"] = per_call(lambda: ops.quantize_dequantize_groups_op(x, offs, "rceil"))
x3, y3 = triton_mx._view3(x, 1), triton_mx._view3(y, 1)
res["us_launch_only"] = per_call(lambda: triton_mx._launch_quant(x3, y3, "rceil", dequant=True))
print(json.dumps(res, indent=1), flush=True)

if dev == "cuda" and os.environ.get("TRAIN", "1") == "1":
    import train_moe
    import torch.nn.functional as F
    args = train_moe.parse_args(["--steps", "1000"])
    data = train_moe.stdlib_bytes()
    train_N, _ = train_moe.split_data(data)
    for recipe, route in [("bf16", "bound"), ("mxfp8", "triton"), ("mxfp8", "cached"), ("mxfp8", "bound"),
                          ("fp8_rowwise", "triton"), ("fp8_rowwise", "cached"), ("fp8_rowwise", "bound")]:
        use_route(route)
        torch._dynamo.reset()
        model = train_moe.build_model(args, dev)
        train_moe.compile_blocks(model, recipe)
        inp, tgt = train_moe.get_batch(train_N, 0, 0, args.batch, args.seq)
        inp, tgt = inp.to(dev), tgt.to(dev)
        def step():
            logits = model(inp)
            loss = F.cross_entropy(logits.float().view(-1, 256), tgt.reshape(-1))
            loss.backward()
            for p in model.parameters(): p.grad = None
        for _ in range(5): step()
        walls = []
        for r in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(20): step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t) / 20 * 1e3)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): step()
            torch.cuda.synchronize()
        kern = sum(k.device_time_total for k in prof.key_averages()) / 5 / 1e3
        print(f"==== train fwd+bwd {recipe} route={route}: wall {sorted(walls)} ms, kernels {kern:.2f} ms", flush=True)
