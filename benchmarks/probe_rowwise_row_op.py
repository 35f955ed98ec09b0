"""fp8_rowwise MoE block side by side in one process, the row quantizers (forward, input gradient)
as Inductor code (old), as our Triton op everywhere (new), as our op for contiguous rows only (mixed).

    SHAPES=dsv3,qwen3_30b,fine64 ROUNDS=3 python benchmarks/probe_rowwise_row_op.py
"""
import sys, copy, contextlib, statistics, os
sys.path.insert(0, "."); sys.path.insert(0, "examples"); sys.path.insert(0, "benchmarks")
import torch
import mxfp8_inductor
from mxfp8_inductor.lowering import ops
from mxfp8_inductor.kernels import rowwise
from moe_model import GroupedExperts
from shapes import SHAPES, TOKENS, uneven_counts
from bench_moe_block import interleaved, sqnr
new_op = ops.quantize_rows_rowwise_op
def inductor_q(x, r):
    d, s = rowwise.quantize_rows(x, -1, r); return d.contiguous(), s
def mixed_q(x, r):
    return new_op(x, r) if x.stride(-1) == 1 else inductor_q(x, r)
VARIANTS = {"old": inductor_q, "new": new_op, "mixed": mixed_q}
@contextlib.contextmanager
def patched(f):
    ops.quantize_rows_rowwise_op = f
    try: yield
    finally: ops.quantize_rows_rowwise_op = new_op
rounds = int(os.environ.get("ROUNDS", "3"))
for shape in os.environ.get("SHAPES", ",".join(SHAPES)).split(","):
    torch._dynamo.reset()
    E, D, F = SHAPES[shape]
    torch.manual_seed(0)
    block = GroupedExperts(E, D, F).cuda().bfloat16()
    x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    counts = uneven_counts(E, TOKENS)
    grad = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    steps, res = {}, {}
    for name in ["bf16"] + list(VARIANTS):
        mod = copy.deepcopy(block)
        fn = torch.compile(mod) if name == "bf16" else torch.compile(mod, backend="mxfp8", options={"recipe": "fp8_rowwise"})
        def step(mod=mod, fn=fn):
            x.grad = None
            for p in mod.parameters(): p.grad = None
            out = fn(x, counts); out.backward(grad); return out
        with patched(VARIANTS.get(name, new_op)):
            out = step()
        res[name] = [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
        steps[name] = step
    ms = interleaved(steps, rounds)
    line = f"{shape:<10} bf16 {statistics.median(ms['bf16']):7.3f} ms"
    for name in VARIANTS:
        ratio = statistics.median(b / t for b, t in zip(ms["bf16"], ms[name]))
        same = all(torch.equal(a, b) for a, b in zip(res["old"], res[name]))
        line += f" | {name} {statistics.median(ms[name]):7.3f} ms {ratio:5.3f}x same={same}"
    print(line, flush=True)
