"""Whole-model training steps: transformers MoE models at real per-layer dimensions, and
TorchTitan's own Qwen3-MoE and DeepSeek-V3 (`titan_*`), bf16 against each recipe, one process per
run.

    python benchmarks/bench_models.py [--models qwen3_30b,mixtral_8x7b] [--variants bf16,mxfp8,fp8_rowwise,auto]
        [--depths 1,2] [--out benchmarks/results/models_h200.json]
    python benchmarks/bench_models.py --combine a.json b.json --out benchmarks/results/models_h200.json

A variant is bf16 or a recipe, with "+all" for targets="all" (dense linears too), "+cache"
for weight_cache=True, "+fsdp" for FSDP2 over this one GPU (each decoder layer, then the root:
every step runs the all-gather hooks, without the transfers of more ranks) and "+fp8ag" for
fsdp_fp8_all_gather=True (the model marked with `mxfp8()` and compiled with the default
backend); or "torchao", the anchor: torchao's FP8 rowwise MoE training under plain torch.compile,
with "+all" also torchao's float8 rowwise linears. On the TorchTitan models it is
TorchTitan's float8 converters, as its trainer applies them (`build_titan`); on transformers
models, torchao's grouped-GEMM weight wrapper on every expert module and its float8 linears on
the dense layers the pass would take (`_torchao`). Neither torchao nor torchtitan is a
dependency of the package: docs/performance.md ("Whole models") lists what these variants need.

A step is what training does: --microbatches forward + loss + backward passes (gradient
accumulation), then AdamW. The whole model is compiled (backend="mxfp8" with the recipe, or
plain torch.compile for bf16), random init, vocabulary 32k. Each (model, variant, depth) runs in a
fresh process so compiles, caches and allocator state do not leak between them. Reported per
run: tokens/s, step ms (median of --steps timed steps after --warmup), peak memory, compile time
(the first step). Per model and variant, from the two depths: the marginal time of one more
layer, which is what a full-depth model sees, and its ratio to bf16 (`speedup`), beside the
whole-step ratio at the deeper depth (`speedup_whole_step`). Ratios are always to the bf16 runs
of the same invocation; `--combine` keeps, per model and variant, the row of the last file that
ran it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

VOCAB = 32000
# transformers config class and per-layer dimensions (the published models', vocabulary aside)
MODELS = {
    "qwen3_30b": ("Qwen3MoeConfig", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                         num_experts=128, num_experts_per_tok=8, num_attention_heads=32,
                                         num_key_value_heads=4, head_dim=128), (4, 2048)),
    "mixtral_8x7b": ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                                           num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=8),
                     (2, 4096)),
    "gpt_oss_20b": ("GptOssConfig", dict(hidden_size=2880, intermediate_size=2880, num_local_experts=32,
                                         num_experts_per_tok=4, num_attention_heads=64, num_key_value_heads=8,
                                         head_dim=64), (4, 2048)),
    # Llama-4-Scout's layer (16 experts top-1 plus a shared expert, hidden 5120, experts 8192) on
    # transformers' Qwen2-MoE class: transformers' Llama 4 does not take the grouped_mm experts path
    "l4scout_dims": ("Qwen2MoeConfig", dict(hidden_size=5120, intermediate_size=8192, moe_intermediate_size=8192,
                                            shared_expert_intermediate_size=8192, num_experts=16,
                                            num_experts_per_tok=1, num_attention_heads=40, num_key_value_heads=8,
                                            norm_topk_prob=False), (4, 4096)),
    # a fine-grained model of about 7B parameters that fits one GPU at full depth (--depths 16)
    "fine64_7b": ("Qwen3MoeConfig", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=1024,
                                         num_experts=64, num_experts_per_tok=8, num_attention_heads=16,
                                         num_key_value_heads=4, head_dim=128), (4, 2048)),
    # one rank's slice of DeepSeek-V3's 256 experts under 8-way expert parallelism
    "dsv3_ep8_slice": ("DeepseekV3Config", dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                                                n_routed_experts=32, num_experts_per_tok=8, n_group=1, topk_group=1,
                                                first_k_dense_replace=0, n_shared_experts=1, num_attention_heads=128,
                                                num_key_value_heads=128), (2, 4096)),
}


# TorchTitan's own models (torchtitan.models.<module>, flavor; tiny flavor; batch, seq), built as
# its trainer builds them from their MoE layers alone (DeepSeek-V3's leading dense layers left out)
TITAN = {
    "titan_qwen3_30b": ("qwen3", "30B-A3B", "debugmodel_moe", (4, 2048)),
    "titan_dsv3_16b": ("deepseek_v3", "16B", "debugmodel", (4, 2048)),
}


def build_titan(name: str, layers: int, device: str, tiny: bool,
                torchao: str | None) -> tuple[torch.nn.Module, tuple[int, int]]:
    """A TorchTitan model of `layers` MoE layers with a 32k vocabulary and causal SDPA attention
    (as the CPU tests build it; every variant the same). `torchao`: "experts" or "all" converts
    it with TorchTitan's float8 converters, as its trainer does (the grouped-experts one also
    pads each expert's token group to torchao's multiple of 16)."""
    import dataclasses
    import importlib

    import torch.distributed.fsdp

    # TorchTitan 0.3.0 imports this FSDP name (torch >= 2.12) for its FSDP helpers, which a
    # single-GPU run never calls: a placeholder lets its models import on older torch.
    if not hasattr(torch.distributed.fsdp, "DataParallelMeshDims"):
        torch.distributed.fsdp.DataParallelMeshDims = type("DataParallelMeshDims", (), {})
    from torchtitan.models.common.attention import ScaledDotProductAttention

    module, flavor, tiny_flavor, (batch, seq) = TITAN[name]
    converters = []
    if torchao is not None:
        from torchtitan.components.quantization.float8 import (
            Float8GroupedExpertsConverter,
            Float8LinearConverter,
        )

        if torchao == "all":  # TorchTitan's recipe settings: rowwise, output and routers bf16
            converters.append(Float8LinearConverter.Config(
                recipe_name="rowwise", filter_fqns=["output", "router.gate", "auto_filter_small_kn"],
                model_compile_enabled=True))
        converters.append(Float8GroupedExpertsConverter.Config(model_compile_enabled=True))
    registry = importlib.import_module(f"torchtitan.models.{module}").model_registry
    config = registry(tiny_flavor if tiny else flavor, converters=converters).model
    sdpa = ScaledDotProductAttention.Config()
    moe_layers = [layer for layer in config.layers if layer.moe is not None][:layers]
    config.layers = [dataclasses.replace(layer, attention=dataclasses.replace(layer.attention, inner_attention=sdpa))
                     for layer in moe_layers]
    config.vocab_size = config.tok_embeddings.num_embeddings = config.lm_head.out_features = VOCAB
    if hasattr(config, "mtp_layers"):
        config.mtp_layers = []
    if tiny:
        batch, seq = 2, 64
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights()
    return model.to(torch.bfloat16), (batch, seq)


def build(name: str, layers: int, device: str, tiny: bool) -> tuple[torch.nn.Module, tuple[int, int]]:
    import transformers

    cls_name, dims, (batch, seq) = MODELS[name]
    config = getattr(transformers, cls_name)(**dims, num_hidden_layers=layers, vocab_size=VOCAB, use_cache=False)
    if tiny:  # a CPU smoke run of the script itself
        from mxfp8_inductor.check import TINY, tiny_config

        config = tiny_config(config, {**TINY, "num_hidden_layers": layers})
        batch, seq = 2, 64
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    return model, (batch, seq)


def _torchao(model: torch.nn.Module, dense: bool) -> int:
    """Convert `model` to torchao's FP8 rowwise training: every module holding 3-D (expert)
    weights gets torchao's grouped-GEMM weight wrapper; with `dense`, every linear that the pass
    rewrites under targets="all" with its defaults (not the output projection or a router, K and
    N at least `dense_min_dim`) becomes torchao's rowwise Float8Linear. Returns the modules
    converted."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig
    from torchao.quantization import quantize_

    from mxfp8_inductor.options import MXFP8Config

    def experts(module: torch.nn.Module, fqn: str) -> bool:
        return any(p.dim() == 3 for p in module.parameters(recurse=False))

    config = MXFP8Config()

    def linears(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and config.matches(fqn, f"{fqn}.weight", dense=True)[0]
                and min(module.in_features, module.out_features) >= config.dense_min_dim
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    count = sum(experts(m, n) for n, m in model.named_modules())
    # torchao pads token groups to its FP8 GEMM's multiple of 16 only when asked: TorchTitan's
    # MoE pads them itself, a transformers model does not (unpadded, torch's kernel asserts)
    quantize_(model, Float8TrainingOpConfig(pad_token_groups_for_grouped_mm=True), filter_fn=experts)
    if dense:
        count += sum(linears(m, n) for n, m in model.named_modules())
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("rowwise"),
                                   module_filter_fn=linears)
    return count


def _fully_shard(model: torch.nn.Module, device: str) -> None:
    """FSDP2 on a one-rank group: each decoder layer (the members of every `layers` ModuleList),
    then the root."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=0,
                            world_size=1)
    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, torch.nn.ModuleList):
            for layer in module:
                fully_shard(layer)
    fully_shard(model)


def build_training(model_name: str, variant: str, depth: int, device: str, tiny: bool,
                   microbatches: int) -> tuple[torch.nn.Module, Callable[[], None], int]:
    """A run's model, compiled as `variant` says, and one training step of it: `microbatches`
    forwards, losses and backwards, then AdamW. Returns (model, step, tokens per step)."""
    import mxfp8_inductor as mx  # also where the package is on PYTHONPATH, not installed
    from mxfp8_inductor import mxfp8_backend

    torch.manual_seed(0)
    recipe, *flags = variant.split("+")
    torchao = ("all" if "all" in flags else "experts") if recipe == "torchao" else None
    titan = model_name in TITAN
    if titan:
        model, (batch, seq) = build_titan(model_name, depth, device, tiny, torchao)
    else:
        model, (batch, seq) = build(model_name, depth, device, tiny)
        if torchao is not None and not _torchao(model, torchao == "all"):
            raise RuntimeError(f"torchao converted nothing in {model_name}")
    if "fp8ag" in flags:
        mx.mxfp8(model, recipe=recipe, fsdp_fp8_all_gather=True)
    if "fsdp" in flags:
        _fully_shard(model, device)
    if recipe in ("bf16", "torchao") or "fp8ag" in flags:
        compiled = torch.compile(model)
    else:
        options = {"recipe": recipe, "targets": "all" if "all" in flags else "experts",
                   "weight_cache": "cache" in flags}
        compiled = torch.compile(model, backend=mxfp8_backend, options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    g = torch.Generator(device=device).manual_seed(0)
    vocab = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
    ids = [torch.randint(0, vocab, (batch, seq), device=device, generator=g) for _ in range(microbatches)]

    def step() -> None:
        for x in ids:
            if titan:  # next-token loss, as transformers computes it from labels=x
                logits = compiled(x)
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
            else:
                loss = compiled(input_ids=x, labels=x).loss
            (loss / len(ids)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, batch * seq * len(ids)


def worker(args: argparse.Namespace) -> dict:
    """One run, in this process."""
    model, train_step, tokens = build_training(args.model, args.variant, args.depth, args.device, args.tiny,
                                               args.microbatches)
    params_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9

    def step() -> float:
        sync()
        start = time.perf_counter()
        train_step()
        sync()
        return time.perf_counter() - start

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    compile_s = step()
    for _ in range(args.warmup - 1):
        step()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = [step() for _ in range(args.steps)]
    step_s = statistics.median(times)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if args.device == "cuda" else float("nan")
    return {"model": args.model, "variant": args.variant, "depth": args.depth, "tokens": tokens,
            "step_ms": step_s * 1e3, "step_ms_all": [t * 1e3 for t in times],
            "tokens_per_s": tokens / step_s, "peak_gb": peak_gb, "params_gb": params_gb,
            "compile_s": compile_s}


RAISED = re.compile(r"[\w.]+(Error|Exception|Unsupported)\b")  # a traceback's exception line


def run_worker(cmd: list[str], timeout: float) -> tuple[dict | None, str | None]:
    """A worker command in a fresh process: (the JSON object its last stdout line holds, None),
    or (None, why it failed: the timeout, or the exception's own line (Dynamo's sits above a long
    user-code trace) then the tail of its stderr)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if proc.returncode:
        raised = [line for line in proc.stderr.splitlines() if RAISED.match(line)]
        return None, f"failed: {raised[-1] if raised else ''}\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def summarize(runs: list[dict], depths: list[int]) -> list[dict]:
    """One row per model and variant: the deeper run's numbers and its per-layer and whole-step
    ratios to the bf16 runs of the same session (one invocation: variants side by side). Where
    several sessions ran a variant, the last in `runs` gives its row. With one depth the
    per-layer figures are the whole step's over the depth."""
    lo, hi = min(depths), max(depths)
    if lo == hi:
        lo = 0
        runs = runs + [{**r, "depth": 0, "step_ms": 0.0} for r in runs if r["depth"] == hi]
    sessions: dict[tuple, dict[tuple[str, int], dict]] = {}
    for r in runs:
        sessions.setdefault((r.get("session"), r["model"]), {})[(r["variant"], r["depth"])] = r
    rows = {}
    for (_, model), by in sessions.items():
        if ("bf16", lo) not in by or ("bf16", hi) not in by:
            continue
        base = by[("bf16", hi)]
        base_per_layer = (base["step_ms"] - by[("bf16", lo)]["step_ms"]) / (hi - lo)
        for (variant, depth), r in by.items():
            if depth != hi or (variant, lo) not in by:
                continue
            per_layer = (r["step_ms"] - by[(variant, lo)]["step_ms"]) / (hi - lo)
            rows[(model, variant)] = {
                **{k: r[k] for k in ("model", "variant", "tokens_per_s", "peak_gb", "params_gb", "compile_s")},
                "layer_ms": per_layer, "speedup": base_per_layer / per_layer,
                "speedup_whole_step": base["step_ms"] / r["step_ms"], "depths": [lo, hi],
                "session": r.get("session")}
    return [rows[k] for k in sorted(rows)]


def write(args: argparse.Namespace, meta: dict, runs: list[dict], depths: list[int]) -> list[dict]:
    """Write the runs so far and their summary rows to --out; returns the rows."""
    rows = summarize(runs, depths)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "rows": rows, "runs": runs}, indent=1) + "\n")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qwen3_30b,mixtral_8x7b",
                   help=f"some of {', '.join([*MODELS, *TITAN])}")
    p.add_argument("--variants", default="bf16,mxfp8,fp8_rowwise")
    p.add_argument("--depths", default="1,2", help="two depths: the per-layer time is their difference")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny dimensions: check the script on a CPU")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results/models_h200.json"))
    p.add_argument("--combine", nargs="+", type=pathlib.Path, help="summarize the runs of these result files")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--depth", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    depths = [int(d) for d in args.depths.split(",")]
    parts = [json.loads(f.read_text()) for f in args.combine or ()]
    # runs that carry no session take their file's
    runs = [{"session": f.stem, **r} for f, part in zip(args.combine or (), parts) for r in part["runs"]]
    session = datetime.datetime.now().isoformat(timespec="seconds")
    meta = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "microbatches": args.microbatches, "steps": args.steps}
    if args.combine:
        meta = {**{k: v for k, v in parts[0].items() if k not in ("rows", "runs")},
                "date": max(part["date"] for part in parts)}
    for model in [] if args.combine else args.models.split(","):
        for depth in depths:
            for variant in args.variants.split(","):
                cmd = [sys.executable, __file__, "--worker", "--model", model, "--variant", variant,
                       "--depth", str(depth), "--device", args.device, "--microbatches", str(args.microbatches),
                       "--warmup", str(args.warmup), "--steps", str(args.steps), *(["--tiny"] if args.tiny else [])]
                result, error = run_worker(cmd, args.timeout)
                if error:
                    print(f"{model} {variant} depth {depth}: {error}", flush=True)
                    continue
                run = {"session": session, **result}
                runs.append(run)
                write(args, meta, runs, depths)  # what has run survives a stopped benchmark
                print(f"{model:<14} {variant:<12} depth {depth}: {run['step_ms']:8.1f} ms/step "
                      f"{run['tokens_per_s']:9.0f} tok/s  peak {run['peak_gb']:6.1f} GB  "
                      f"compile {run['compile_s']:5.1f} s", flush=True)
    rows = write(args, meta, runs, depths)
    print(f"\n{'model':<14} {'variant':<12} {'per layer':>9} {'whole step':>10} {'peak GB':>8}")
    for r in rows:
        print(f"{r['model']:<14} {r['variant']:<12} {r['speedup']:8.3f}x {r['speedup_whole_step']:9.3f}x "
              f"{r['peak_gb']:8.1f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
