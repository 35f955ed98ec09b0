"""Probe torch's FP8 rowwise grouped GEMM on the GPU: unaligned groups, empty groups, and its
rate vs bf16 `_grouped_mm` (and, with AUTOTUNE=1, vs Inductor's max-autotune template) per GEMM
of the DESIGN §8 shapes.

    AUTOTUNE=1 python benchmarks/probe_fp8_grouped_gemm.py  -> $OUT (or .)/probe_rowwise.json

Weight-gradient timings use group sizes rounded down to multiples of 16 (the 2d-2d kernel
asserts on others).
"""
import json, os, sys, time
import torch
from triton.testing import do_bench
sys.path.insert(0, "benchmarks")
from shapes import SHAPES, TOKENS, uneven_counts

torch.manual_seed(0)
dev = "cuda"
F8 = torch.float8_e4m3fn
out = {}

def q_rows(x, dim):  # rowwise along dim, power-of-two scale
    amax = x.float().abs().amax(dim=dim, keepdim=True).clamp_min(1e-30)
    s = torch.exp2(torch.floor(torch.log2(448.0 / amax)))
    return (x.float() * s).to(F8), (1.0 / s)

def offs_of(counts):
    return torch.cumsum(counts, 0).to(torch.int32)

# a) 2d-3d unaligned offsets
M, K, N, E = 1008, 256, 384, 4
counts = torch.tensor([300, 0, 411, 297], device=dev)
offs = offs_of(counts)
x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16)
xq, xs = q_rows(x, 1)
wq, ws = q_rows(w, 2)
o = torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), xs.squeeze(1), ws.squeeze(2), offs=offs, out_dtype=torch.bfloat16)
xd = xq.float() * xs; wd = wq.float() * ws
ref = torch._grouped_mm(xd.bfloat16(), wd.bfloat16().transpose(-2, -1), offs=offs).float()
err = ((o.float() - ref)[:offs[-1]].norm() / ref[:offs[-1]].norm()).item()
out["2d3d_unaligned_relerr"] = err
print(out, flush=True)
counts = torch.tensor([304, 0, 416, 288], device=dev)
offs = offs_of(counts)
# b) 2d-2d (wgrad) unaligned and empty
dout = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
gid = torch.repeat_interleave(torch.arange(E, device=dev), counts)
def q_groups(t):  # t [M, C] -> data^T [C, M], scales [E*C]
    amax = torch.zeros(E, t.shape[1], device=dev).scatter_reduce(0, gid[:, None].expand(-1, t.shape[1]), t.float().abs(), "amax")
    amax = amax.clamp_min(1e-30)
    s = torch.exp2(torch.floor(torch.log2(448.0 / amax)))
    d = (t.float() * s[gid]).to(F8)
    return d.t().contiguous(), (1.0 / s).reshape(-1), (d.float() / s[gid])
aq, as_, ad = q_groups(dout)   # a = dout^T [N, M]
bq, bs, bd = q_groups(x)       # b = x [M, K] col-major
for trial in range(3):
    junk = torch.full((E, N, K), float("nan"), device=dev, dtype=torch.bfloat16); del junk
    o2 = torch._scaled_grouped_mm(aq, bq.t(), as_, bs, offs=offs, out_dtype=torch.bfloat16)
ref2 = torch._grouped_mm(ad.t().contiguous().bfloat16(), bd.bfloat16(), offs=offs).float()
nz = counts > 0
out["2d2d_unaligned_relerr"] = ((o2.float() - ref2)[nz].norm() / ref2[nz].norm()).item()
out["2d2d_empty_group_absmax"] = o2[1].float().abs().max().item()
out["2d2d_empty_group_nan"] = bool(o2[1].isnan().any())
ref_empty = torch._grouped_mm(ad.t().contiguous().bfloat16(), bd.bfloat16(), offs=offs)[1]
out["bf16_grouped_mm_empty_group_absmax"] = ref_empty.float().abs().max().item()
print(json.dumps(out), flush=True)

# c) timing per GEMM at the 4 shapes
rows = []
def tflops(flop, ms): return flop / ms / 1e9
for name, (E, D, Fh) in SHAPES.items():
    counts = uneven_counts(E, TOKENS); offs = offs_of(counts)
    cw = (counts // 16) * 16; cw[0] += TOKENS - cw.sum(); offs_w = offs_of(cw)
    for gemm, (K, N) in {"w13": (D, Fh), "w2": (Fh, D)}.items():
        x = torch.randn(TOKENS, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16)
        xq, xs = q_rows(x, 1); wq, ws = q_rows(w, 2)
        xs, ws = xs.squeeze(1).contiguous(), ws.squeeze(2).contiguous()
        flop = 2 * TOKENS * K * N
        t_bf = do_bench(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), return_mode="median")
        t_f8 = do_bench(lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), xs, ws, offs=offs, out_dtype=torch.bfloat16), return_mode="median")
        dout = torch.randn(TOKENS, N, device=dev, dtype=torch.bfloat16)
        t_bf_w = do_bench(lambda: torch._grouped_mm(dout.t(), x, offs=offs_w), return_mode="median")
        aq = torch.randn(N, TOKENS, device=dev).to(F8); bq = torch.randn(K, TOKENS, device=dev).to(F8)
        sa = torch.rand(E * N, device=dev); sb = torch.rand(E * K, device=dev)
        t_f8_w = do_bench(lambda: torch._scaled_grouped_mm(aq, bq.t(), sa, sb, offs=offs_w, out_dtype=torch.bfloat16), return_mode="median")
        row = {"shape": name, "gemm": gemm, "fwd_bf16_tflops": tflops(flop, t_bf), "fwd_fp8_cutlass_tflops": tflops(flop, t_f8),
               "wgrad_bf16_tflops": tflops(flop, t_bf_w), "wgrad_fp8_cutlass_tflops": tflops(flop, t_f8_w)}
        if os.environ.get("AUTOTUNE") and name in ("fine64", "qwen3_30b"):
            t0 = time.time()
            torch._dynamo.reset()
            f = torch.compile(lambda a, b, sa, sb, o: torch._scaled_grouped_mm(a, b, sa, sb, offs=o, out_dtype=torch.bfloat16), mode="max-autotune-no-cudagraphs")
            f(xq, wq.transpose(-2, -1), xs, ws, offs)
            row["fwd_fp8_autotuned_tflops"] = tflops(flop, do_bench(lambda: f(xq, wq.transpose(-2, -1), xs, ws, offs), return_mode="median"))
            g = torch.compile(lambda a, b, sa, sb, o: torch._scaled_grouped_mm(a, b, sa, sb, offs=o, out_dtype=torch.bfloat16), mode="max-autotune-no-cudagraphs")
            g(aq, bq.t(), sa, sb, offs_w)
            row["wgrad_fp8_autotuned_tflops"] = tflops(flop, do_bench(lambda: g(aq, bq.t(), sa, sb, offs_w), return_mode="median"))
            row["autotune_s"] = time.time() - t0
        rows.append(row)
        print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
out["rows"] = rows
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "probe_rowwise.json"), "w"), indent=1)
