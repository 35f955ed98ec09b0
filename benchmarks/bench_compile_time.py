"""Compile time of backend="mxfp8" vs plain torch.compile on the same model (fwd+bwd, cold caches).

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python benchmarks/bench_compile_time.py [--out benchmarks/results/compile_time_h200.json]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import pathlib
import sys
import time

import torch
import triton

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
import mxfp8_inductor  # noqa: E402,F401
from moe_model import MoEModel  # noqa: E402


def first_step_s(model: torch.nn.Module, backend: str, x: torch.Tensor) -> float:
    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend)
    start = time.perf_counter()
    fn(x).float().sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/compile_time_h200.json")
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = MoEModel(dim=2048, hidden=768, num_experts=16, top_k=2, layers=4, shared_expert=True).to(dev, torch.bfloat16)
    x = torch.randn(1, 4096, 2048, device=dev, dtype=torch.bfloat16)
    first_step_s(copy.deepcopy(model), "inductor", x)  # warm the process (imports, Triton, autotuner caches off)
    plain = first_step_s(copy.deepcopy(model), "inductor", x)
    mx = first_step_s(copy.deepcopy(model), "mxfp8", x)
    row = {"model": "MoEModel 4 layers, 16 experts, dim 2048, hidden 768, shared expert, 4096 tokens",
           "plain_s": plain, "mxfp8_s": mx, "overhead": mx / plain - 1}
    print(f"first step (compile) plain {plain:.1f} s, mxfp8 {mx:.1f} s, overhead {row['overhead']:+.1%}")
    result = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
              "triton": triton.__version__, "date": datetime.date.today().isoformat(), "rows": [row]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
