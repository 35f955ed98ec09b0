"""Per-GEMM time of the forward-layout (2d-3d) grouped GEMM at the small MoE shapes: torch's bf16
`_grouped_mm`, torch's rowwise FP8 `_scaled_grouped_mm` (CUTLASS) and our Triton FP8 grouped GEMM
(its autotuned config printed), on random operands with uneven token groups.

    python benchmarks/probe_fp8_gemm_rates.py  -> $OUT (or .)/gemm_probe.json
"""
import json, os, sys
import torch
from triton.testing import do_bench
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from shapes import SHAPES, TOKENS, uneven_counts
from mxfp8_inductor.kernels import triton_fp8_gemm as T
F8 = torch.float8_e4m3fn
rows = []
for name in ("qwen3_30b", "fine64"):
    E, D, Fh = SHAPES[name]
    offs = torch.cumsum(uneven_counts(E, TOKENS), 0).int()
    for gemm, (K, N) in {"w13": (D, Fh), "w2": (Fh, D)}.items():
        x = torch.randn(TOKENS, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
        xq = x.to(F8); wq = w.to(F8)
        sa = torch.rand(TOKENS, device="cuda"); sb = torch.rand(E, N, device="cuda")
        flop = 2 * TOKENS * K * N
        f = {"bf16": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
             "cutlass_fp8": lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16),
             "ours": lambda: T.scaled_grouped_mm(xq, wq.transpose(-2, -1), sa, sb, offs)}
        r = {"shape": name, "gemm": gemm}
        for k, fn in f.items():
            fn(); torch.cuda.synchronize()
            ms = do_bench(fn, return_mode="median")
            r[k + "_ms"] = round(ms, 4); r[k + "_tflops"] = round(flop / ms / 1e9, 1)
        r["ours_config"] = str(T._picked.get((N, K)))
        print(json.dumps(r), flush=True); rows.append(r)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "gemm_probe.json"), "w"), indent=1)
