"""What `recipe="auto"` chooses by measurement (autotune on) for the routed-expert GEMMs of the
benchmark models on this GPU, with and without the weight cache, and how long the timing takes.

    python benchmarks/auto_choices.py [--out benchmarks/results/auto_choices_<card>.json]

Each (K, N) is one expert weight's GEMM (w1 and w3 fused, as transformers stores them; then w2)
at one microbatch's routed tokens of `bench_models.py`'s model (batch x sequence x top-k rows in
uniform groups), timed as the pass times them for a compiled model (`compiled=True`:
fp8_rowwise's forward and input gradient with their activation's rows quantized by its
producer). The times are kept in Inductor's cache directory as in a compile: run with a
fresh TORCHINDUCTOR_CACHE_DIR to time them anew.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch
from shapes import MODEL_EXPERT_GEMMS, card, require_gpu

from mxfp8_inductor.lowering import auto

# TorchTitan's Qwen3 has the transformers model's expert GEMMs
MODELS = {name: gemms for name, gemms in MODEL_EXPERT_GEMMS.items() if name != "titan_qwen3_30b"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, help="default benchmarks/results/auto_choices_<card>.json")
    args = p.parse_args()
    require_gpu()
    args.out = args.out or pathlib.Path(f"benchmarks/results/auto_choices_{card()}.json")
    device = torch.device("cuda")
    rows = []
    for cached in (False, True):
        for model, (E, M, *shapes) in MODELS.items():
            for K, N in shapes:
                start = time.perf_counter()
                plan = auto.plan_for("auto", "quantized", M=M, K=K, N=N, E=E, dense=False, device=device,
                                     autotune=True, cached=cached, compiled=True)
                seconds = time.perf_counter() - start
                print(f"{model} weight_cache={cached} K={K} N={N}: {plan.impls} ({seconds:.1f} s)", flush=True)
                for reason in plan.reasons:
                    print("   ", reason)
                rows.append(dict(model=model, E=E, M=M, K=K, N=N, cached=cached, recipes=plan.impls,
                                 reasons=plan.reasons, seconds=seconds))
    meta = dict(gpu=torch.cuda.get_device_name(device), torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
