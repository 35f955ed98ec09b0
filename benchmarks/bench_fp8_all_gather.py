"""What `fsdp_fp8_all_gather=True` costs and saves per MoE layer, on one GPU: the bytes a rank
sends per all-gather of a layer's expert weights (bf16 against FP8 data + scales), and the time of
the hooks around it (`fsdp_pre_all_gather` quantizing the rank's shard, once per optimizer step;
`fsdp_post_all_gather` dequantizing the gathered weight, at every all-gather), beside the time
the saved bytes take on a link of the given bandwidth. Run side by side in one process, for each
recipe.

    python benchmarks/bench_fp8_all_gather.py [--ranks 8] [--link-gbps 400]
        [--out benchmarks/results/fp8_all_gather_h200.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib

import torch

from mxfp8_inductor.fsdp import FP8AllGatherWeight

# (experts, expert hidden N, model dim K) of one layer; w1, w3 [E, N, K] and w2 [E, K, N]
SHAPES = {"fine64_7b": (64, 1024, 2048), "qwen3_30b": (128, 768, 2048), "l4scout_dims": (16, 8192, 5120)}


class _Mesh:
    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


def _ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def measure(name: str, recipe: str, ranks: int, link_gbps: float) -> dict:
    E, N, K = SHAPES[name]
    shards = [torch.randn(E // ranks, *dims, device="cuda", dtype=torch.bfloat16) * 0.02
              for dims in ((N, K), (N, K), (K, N))]
    weights = [FP8AllGatherWeight(s, recipe, "rceil") for s in shards]
    mesh = _Mesh(ranks)
    inputs = [w.fsdp_pre_all_gather(mesh, torch.Size((E, *w.shape[1:])), (), None, None)[0] for w in weights]
    # what every rank receives: its own inputs repeated stand in for the other ranks'
    gathered = [tuple(torch.cat([t] * ranks) for t in inp) for inp in inputs]
    bf16_bytes = sum(s.numel() * s.element_size() for s in shards)
    fp8_bytes = sum(t.numel() * t.element_size() for inp in inputs for t in inp)

    def pre() -> None:  # a shard's quantization, which it makes once per optimizer step
        for w in weights:
            w._fp8 = None
            w.fsdp_pre_all_gather(mesh, torch.Size((E, *w.shape[1:])), (), None, None)

    def post() -> None:
        for w, g in zip(weights, gathered):
            w.fsdp_post_all_gather(g, None, torch.bfloat16)

    saved_ms = (bf16_bytes - fp8_bytes) * (ranks - 1) / (link_gbps * 1e9) * 1e3
    return {"model": name, "recipe": recipe, "experts": E, "N": N, "K": K, "ranks": ranks,
            "bf16_bytes_per_rank": bf16_bytes, "fp8_bytes_per_rank": fp8_bytes, "ratio": fp8_bytes / bf16_bytes,
            "pre_ms": _ms(pre), "post_ms": _ms(post), "link_gbps": link_gbps, "transfer_saved_ms": saved_ms}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--link-gbps", type=float, default=400.0, help="per-GPU all-gather bandwidth, GB/s")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results/fp8_all_gather_h200.json"))
    args = p.parse_args()
    rows = [measure(name, recipe, args.ranks, args.link_gbps) for name in SHAPES for recipe in ("mxfp8", "fp8_rowwise")]
    print(f"{'model':<13} {'recipe':<12} {'bytes':>6} {'pre ms':>7} {'post ms':>8} {'saved ms':>9}")
    for r in rows:
        print(f"{r['model']:<13} {r['recipe']:<12} {r['ratio']:6.4f} {r['pre_ms']:7.3f} {r['post_ms']:8.3f} "
              f"{r['transfer_saved_ms']:9.3f}")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "rows": rows}
    args.out.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
