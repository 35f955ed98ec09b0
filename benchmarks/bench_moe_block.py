"""MoE block forward+backward: bf16 compiled vs the same module compiled with backend="mxfp8",
once per recipe; or, with --gemms, the rate of each expert GEMM by role and kernel.

    python benchmarks/bench_moe_block.py [--out benchmarks/results/moe_block_h200.json]
        [--shapes dsv3,fine64] [--recipes mxfp8,fp8_rowwise,auto+cache] [--microbatches 4] [--rounds 5]
        [--cudagraphs]
    python benchmarks/bench_moe_block.py --gemms [--autotune] [--gemm-shapes 128x512x2048x1536,...]
        [--out benchmarks/results/grouped_gemm_rates_h200.json]

Block = w1 and w3 grouped GEMMs, silu-mul, w2 grouped GEMM (`shapes.GroupedExperts`), 32768
routed tokens in uneven groups per microbatch; a step is --microbatches forwards and backwards
and an optimizer step writing every weight. Measured side by side in one run on one GPU: the variants take
turns over --rounds rounds, and each speedup is the median of the per-round ratios (host-bound
shapes move by 0.1x and more between runs on a busy host). --cudagraphs compiles every variant,
bf16 included, with Inductor's CUDA graphs (what `mode="reduce-overhead"` turns on), which take
the host's launches out of the step wherever an op lets them.

--gemms times each expert GEMM alone on random operands, uniform token groups, one row per role
and shape of `RATE_SHAPES` (docs/performance.md, "FP8 grouped GEMM rates"): the forward and input
gradient (2d-3d) and the weight gradient (2d-2d) in torch's bf16 `_grouped_mm`, torch's rowwise
FP8 `_scaled_grouped_mm`, our Triton FP8 grouped GEMM and its blockwise mode (fp8_blockwise's
scales per 128 along the contraction); with
--autotune also Inductor's Triton template for `_scaled_grouped_mm` under max-autotune (about two
minutes of autotuning per GEMM).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import logging
import statistics
from functools import partial

import torch
import triton
from shapes import MODEL_EXPERT_GEMMS, SHAPES, TOKENS, block_and_inputs, require_gpu
from triton.testing import do_bench

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed
from mxfp8_inductor.check import sqnr

F8 = torch.float8_e4m3fn


def options_of(variant: str) -> dict:
    """The backend options of a variant "RECIPE[+cache]" ("+cache": weight_cache=True)."""
    recipe, *flags = variant.split("+")
    if set(flags) - {"cache"}:
        raise SystemExit(f"unknown variant flag in {variant!r}: only +cache")
    return {"recipe": recipe, "weight_cache": "cache" in flags}


def measure(shape: str, variants: list[str], rounds: int, microbatches: int, cudagraphs: bool = False) -> list[dict]:
    """bf16 compiled and each variant compiled, timed side by side on the same inputs: a step is
    `microbatches` forwards and backwards, the gradients accumulated, then an optimizer step
    that writes every weight (so a variant with the weight cache quantizes each weight once per
    step, as in training). The SQNRs compare the first microbatch's output and gradients.
    `cudagraphs`: every variant compiled with Inductor's CUDA graphs."""
    block, x, counts, grad = block_and_inputs(shape)
    inductor = {"triton.cudagraphs": True} if cudagraphs else {}
    fns = {"bf16": (block, torch.compile(block, options=inductor))}
    for variant in variants:
        mod = copy.deepcopy(block)
        options = {**options_of(variant), "inductor": inductor}
        fns[variant] = (mod, torch.compile(mod, backend=mxfp8_backend, options=options))
    results, steps, choices = {}, {}, {}
    for name, (mod, fn) in fns.items():
        with pass_log() as choices[name]:  # the first call compiles: what the pass chose, per GEMM
            out = fwd_bwd(mod, fn, x, counts, grad)()
        results[name] = [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
        steps[name] = train_step(mod, fn, x, counts, grad, microbatches, cudagraphs)
    ms = interleaved(steps, rounds)
    ref = results["bf16"]
    rows = []
    for v in variants:
        ratios = [b / t for b, t in zip(ms["bf16"], ms[v])]
        rows.append({"shape": shape, "recipe": v, "microbatches": microbatches, "cudagraphs": cudagraphs,
                     "bf16_ms": statistics.median(ms["bf16"]), "ms": statistics.median(ms[v]),
                     "speedup": statistics.median(ratios),
                     "speedup_rounds": ratios, "choices": choices[v], "sqnr_out": sqnr(ref[0], results[v][0]),
                     "sqnr_grads_min": min(sqnr(a, b) for a, b in zip(ref[1:], results[v][1:]))})
    return rows


@contextlib.contextmanager
def pass_log():
    """The pass's log lines (one per rewritten GEMM: role, recipe, weight, reason) while in the block."""
    lines, logger = [], logging.getLogger("mxfp8_inductor")
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def fwd_bwd(mod: torch.nn.Module, fn, x: torch.Tensor, counts: torch.Tensor, grad: torch.Tensor):
    """One forward and backward of `fn` (the compiled `mod`) with the gradients cleared first."""
    def step():
        x.grad = None
        for p in mod.parameters():
            p.grad = None
        torch.compiler.cudagraph_mark_step_begin()  # as in `train_step`
        out = fn(x, counts)
        out.backward(grad)
        return out
    return step


def train_step(mod: torch.nn.Module, fn, x: torch.Tensor, counts: torch.Tensor, grad: torch.Tensor,
               microbatches: int, cudagraphs: bool = False):
    """`microbatches` forwards and backwards of `fn` accumulating gradients, then an SGD step
    (a tiny learning rate: the weights are written, and move too little to change the timings).
    `cudagraphs` (`fn` compiled with them): the gradients are zeroed, not freed, so that they
    never become a CUDA graph's output, which the next microbatch's replay would write over."""
    opt = torch.optim.SGD(mod.parameters(), lr=1e-9, foreach=True)
    if cudagraphs:
        for p in mod.parameters():
            p.grad = torch.zeros_like(p)

    def step():
        opt.zero_grad(set_to_none=not cudagraphs)
        for _ in range(microbatches):
            x.grad = None
            torch.compiler.cudagraph_mark_step_begin()  # each microbatch a new step of CUDA graphs, where on
            fn(x, counts).backward(grad)
        opt.step()
    return step


def interleaved(steps: dict, rounds: int, bench=None) -> dict[str, list[float]]:
    """Median ms of each step per round, the steps taking turns round after round: a slow spell of
    the host then hits every variant alike instead of whichever was being timed."""
    bench = bench or (lambda fn: do_bench(fn, warmup=10, rep=100, return_mode="median"))
    for fn in steps.values():  # warm-up: autotuning and allocator growth out of the timed rounds
        bench(fn)
    ms = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            ms[name].append(bench(fn))
    return ms


def _template(*args) -> float:
    """ms of `_scaled_grouped_mm` on `args` as Inductor's max-autotune picks it."""
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, sa, sb, offs: torch._scaled_grouped_mm(a, b, sa, sb, offs=offs,
                                                                         out_dtype=torch.bfloat16),
                      mode="max-autotune-no-cudagraphs")
    f(*args)
    return do_bench(lambda: f(*args), return_mode="median")


# (experts, rows per group, K, N) of the forward GEMM: fine-grained and coarse layers at published
# dimensions, then each benchmark block's w1/w3 and w2 and each benchmark model's, at its mean
# group size
RATE_SHAPES = [(128, 512, 2048, 1536), (128, 512, 768, 2048), (64, 1024, 2048, 2048), (64, 1024, 1024, 2048),
               (32, 1024, 7168, 4096), (32, 1024, 2048, 7168), (8, 2048, 4096, 28672), (8, 2048, 14336, 4096)]
RATE_SHAPES += [(E, TOKENS // E, *KN) for E, D, F in SHAPES.values() for KN in ((D, F), (F, D))]
RATE_SHAPES += [(E, M // E, *KN) for E, M, w13, w2 in MODEL_EXPERT_GEMMS.values() for KN in (w13, w2)]
RATE_SHAPES = list(dict.fromkeys(RATE_SHAPES))


def gemm_rates(experts: int, rows: int, K: int, N: int, autotune: bool) -> list[dict]:
    """TFLOP/s of one expert GEMM per role and kernel, uniform groups of `rows` tokens. The forward
    (x_MK @ w_EKN) and the input gradient (grad_MN @ w_ENK, the forward with K and N swapped) are
    M-grouped 2d-3d GEMMs; the weight gradient (grad_NM @ x_MK per group) is K-grouped 2d-2d."""
    from mxfp8_inductor.kernels import triton_fp8_gemm
    from mxfp8_inductor.kernels.blockwise import SCALE_TILE, tiles

    M = experts * rows
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * rows
    scaled = partial(torch._scaled_grouped_mm, out_dtype=torch.bfloat16)
    def p2(*shape: int) -> torch.Tensor:  # blockwise scales: powers of two
        return torch.exp2(torch.randint(-4, 4, shape, device="cuda").float())

    out = []
    for role, (k, n) in {"forward": (K, N), "dgrad": (N, K)}.items():
        a_MK = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
        w_ENK = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
        args = (a_MK.to(F8), w_ENK.to(F8).transpose(-2, -1), torch.rand(M, device="cuda"),
                torch.rand(experts, n, device="cuda"), offs)
        kernels = {"bf16": partial(torch._grouped_mm, a_MK, w_ENK.transpose(-2, -1), offs=offs),
                   "fp8_torch": partial(scaled, *args[:4], offs=offs),
                   "fp8_ours": partial(triton_fp8_gemm.scaled_grouped_mm, *args),
                   "fp8_blockwise": partial(triton_fp8_gemm.blockwise_grouped_mm, *args[:2], p2(M, tiles(k)),
                                            p2(experts, tiles(k), tiles(n)), offs)}
        out.append((role, k, n, kernels, partial(_template, *args)))
    grad_NM = torch.randn(N, M, device="cuda", dtype=torch.bfloat16)  # the transposed output gradient
    x_MK = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    args = (grad_NM.to(F8), x_MK.t().contiguous().to(F8).t(), torch.rand(experts * N, device="cuda"),
            torch.rand(experts * K, device="cuda"), offs)
    kernels = {"bf16": partial(torch._grouped_mm, grad_NM, x_MK, offs=offs),
               "fp8_torch": partial(scaled, *args[:4], offs=offs),
               "fp8_ours": partial(triton_fp8_gemm.scaled_grouped_mm, *args),
               "fp8_blockwise": partial(triton_fp8_gemm.blockwise_grouped_mm, *args[:2], p2(M // SCALE_TILE, N),
                                        p2(M // SCALE_TILE, K), offs)}
    out.append(("wgrad", K, N, kernels, partial(_template, *args)))
    rows_out = []
    for role, k, n, kernels, template in out:
        row = {"role": role, "experts": experts, "rows_per_group": rows, "K": k, "N": n}
        ms = {}
        for name, fn in kernels.items():
            fn()  # our GEMM autotunes on its first call
            ms[name] = do_bench(fn, return_mode="median")
        if autotune:
            ms["fp8_template"] = template()
        for name, t in ms.items():
            row[f"{name}_tflops"] = round(2 * M * k * n / t / 1e9, 1)
        print(" ".join(f"{key} {v}" for key, v in row.items()), flush=True)
        rows_out.append(row)
    return rows_out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON path (default: benchmarks/results/moe_block_h200.json, or "
                                 "grouped_gemm_rates_h200.json with --gemms)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--recipes", default="mxfp8,fp8_rowwise",
                   help='variants "RECIPE[+cache]" (+cache: weight_cache=True), comma-separated')
    p.add_argument("--microbatches", type=int, default=1, help="forwards and backwards per optimizer step")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per variant")
    p.add_argument("--cudagraphs", action="store_true", help="compile every variant with Inductor's CUDA graphs")
    p.add_argument("--gemms", action="store_true", help="time each expert GEMM by role and kernel instead")
    p.add_argument("--autotune", action="store_true", help="with --gemms: time Inductor's max-autotune template too")
    p.add_argument("--gemm-shapes", help="with --gemms: EXRXKXN forward shapes (experts, rows per group, K, N), "
                                         "comma-separated, instead of all of RATE_SHAPES")
    args = p.parse_args()
    require_gpu()
    rows = []
    out = args.out or f"benchmarks/results/{'grouped_gemm_rates' if args.gemms else 'moe_block'}_h200.json"

    def save() -> None:  # after every shape: a run cut short keeps what it measured
        result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                  "date": datetime.date.today().isoformat(), "rows": rows}
        with open(out, "w") as f:
            json.dump(result, f, indent=1)

    if args.gemms:
        shapes = RATE_SHAPES
        if args.gemm_shapes:
            shapes = [tuple(int(d) for d in shape.split("x")) for shape in args.gemm_shapes.split(",")]
        for shape in shapes:
            rows += gemm_rates(*shape, args.autotune)
            save()
    else:
        print(f"{'shape':<10} {'recipe':<12} {'bf16 ms':>8} {'ms':>8} {'bf16/recipe':>11} {'SQNR out':>8} "
              f"{'grads min':>9}")
        for shape in args.shapes.split(","):
            torch._dynamo.reset()
            for row in measure(shape, args.recipes.split(","), args.rounds, args.microbatches, args.cudagraphs):
                rows.append(row)
                print(f"{shape:<10} {row['recipe']:<12} {row['bf16_ms']:8.3f} {row['ms']:8.3f} {row['speedup']:10.2f}x"
                      f" {row['sqnr_out']:8.1f} {row['sqnr_grads_min']:9.1f}", flush=True)
            save()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
