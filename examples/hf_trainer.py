"""Train a transformers MoE model with `transformers.Trainer`, its routed experts' grouped GEMMs in MXFP8.

    python examples/hf_trainer.py                               # tiny random-init Qwen3-MoE
    python examples/hf_trainer.py --model mixtral --baseline    # and a bf16 run from the same weights
    python examples/hf_trainer.py --model Qwen/Qwen3-30B-A3B --full-size --layers 2 --recipe fp8_rowwise

The model is marked with `mxfp8_inductor.mxfp8(...)` and Trainer compiles it with the default
Inductor backend (`torch_compile=True`). `torch_compile_backend="mxfp8"` cannot be used: accelerate
converts the name to its `DynamoBackend` enum, which lists only built-in backends and raises
ValueError for any other, and Trainer has no setting for backend options.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sysconfig
import tempfile
from collections.abc import Sequence

import torch
import transformers

import mxfp8_inductor as mx
from mxfp8_inductor.check import TINY, text_config, tiny_config
from mxfp8_inductor.options import RECIPES

VOCAB = 256  # byte-level: the text needs no tokenizer


def stdlib_windows(count: int, seq: int) -> list[dict[str, torch.Tensor]]:
    """`count` consecutive windows of `seq` bytes of the standard library's source as causal-LM
    examples (the model shifts the labels itself): real text, no download."""
    text = bytearray()
    for path in sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text += path.read_bytes()
        if len(text) >= count * seq:
            break
    ids = torch.frombuffer(text[: count * seq], dtype=torch.uint8).long().view(count, seq)
    return [{"input_ids": window, "labels": window} for window in ids]


def build_model(name: str, full_size: bool = False, layers: int = 2) -> transformers.PreTrainedModel:
    """A random-init bf16 causal LM of a model type, Hub id or config folder, `layers` deep: with the
    config's widths if `full_size`, else shrunk like `python -m mxfp8_inductor.check` (hidden size 64,
    8 experts top-2) to a byte vocabulary."""
    config = text_config(name)
    if full_size:
        config = tiny_config(config, {"num_hidden_layers": layers, "vocab_size": config.vocab_size})
    else:
        config = tiny_config(config, {**TINY, "num_hidden_layers": layers, "vocab_size": VOCAB})
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def train(
    model: torch.nn.Module, data: Sequence[dict[str, torch.Tensor]], steps: int, batch: int, lr: float,
    seed: int = 0, torch_compile: bool = True,
) -> list[float]:
    """Train with Trainer (AdamW, warmup then linear decay, shuffled batches seeded by `seed`); returns
    the loss of every step."""
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=lr, warmup_steps=steps // 10,
            logging_steps=1, save_strategy="no", report_to="none", seed=seed, torch_compile=torch_compile,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3_moe", help="model type (qwen3_moe, mixtral, ...), Hub id or config folder")
    p.add_argument("--full-size", action="store_true", help="keep the config's widths (default: a tiny copy)")
    p.add_argument("--layers", type=int, default=2, help="number of layers (default: 2)")
    p.add_argument("--recipe", default="mxfp8", choices=RECIPES, help="auto: per GEMM the fastest on this GPU")
    p.add_argument("--exclude", action="append", default=[], help="FQN glob kept in bf16 (repeatable)")
    p.add_argument("--baseline", action="store_true", help="also train a bf16 copy from the same weights and data")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    transformers.set_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the device Trainer picks
    model = build_model(args.model, args.full_size, args.layers).to(device)
    baseline = copy.deepcopy(model) if args.baseline else None  # copied before marking: stays bf16
    data = stdlib_windows(args.steps * args.batch, args.seq)
    mx.mxfp8(model, recipe=args.recipe, exclude=args.exclude)
    print(mx.explain(model, data[0]["input_ids"][None].to(device)), "\n")

    runs = {args.recipe: train(model, data, args.steps, args.batch, args.lr, args.seed)}
    if baseline is not None:
        runs["bf16"] = train(baseline, data, args.steps, args.batch, args.lr, args.seed)
    print("\nstep " + "".join(f"{name:>12}" for name in runs))
    for step, losses in enumerate(zip(*runs.values()), 1):
        print(f"{step:4d} " + "".join(f"{loss:12.4f}" for loss in losses))


if __name__ == "__main__":
    main()
