"""Training parity over seeds: each recipe's final loss against the bf16 run of the same seed, and
the noise floor (bf16 with its initial weights nudged, against bf16) measured the same way.

    python examples/seed_summary.py [--out examples/results/convergence_seeds_h200.json]

Reads the 1000-step one-GPU summaries of train_moe.py in examples/results. A recipe is within
noise when its mean paired gap is within max(0.3%, two standard errors of the gaps) of zero and
no more than 6 of 8 seeds (three quarters) fall on one side.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from train_moe import _tail_mean  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
MIN_BAR = 0.003
NOISE = "bf16, weights nudged"


def final_losses(paths: list[pathlib.Path]) -> dict[int, dict[str, float]]:
    """{seed: {recipe: mean loss of the last 100 steps}} over the 1000-step one-GPU runs; a bf16
    run with nudged initial weights counts as the recipe `NOISE`."""
    out: dict[int, dict[str, float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        cfg = data.get("config")
        if cfg is None or data["steps"] != 1000 or cfg["world_size"] != 1:
            continue  # not a train_moe.py summary (this script's own output), or not a full one-GPU run
        for recipe, r in data["recipes"].items():
            if len(r["loss"]) == 1000:
                name = NOISE if cfg.get("init_noise") and recipe == "bf16" else recipe
                out.setdefault(cfg["seed"], {})[name] = _tail_mean(r["loss"])
    return dict(sorted(out.items()))


def summarize(gaps: dict[int, float]) -> dict:
    vals = list(gaps.values())
    n = len(vals)
    mean = statistics.fmean(vals)
    stdev = statistics.stdev(vals) if n > 1 else 0.0
    bar = max(MIN_BAR, 2 * stdev / math.sqrt(n))
    one_side = max(sum(v > 0 for v in vals), sum(v < 0 for v in vals))
    return {"gap_by_seed": gaps, "mean_gap": mean, "stdev_gap": stdev, "bar": bar, "seeds": n,
            "most_on_one_side": one_side, "within_noise": abs(mean) <= bar and one_side <= math.floor(0.75 * n)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=pathlib.Path, default=RESULTS, help="folder of train_moe.py summaries")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS / "convergence_seeds_h200.json")
    args = p.parse_args(argv)
    losses = final_losses(sorted(args.results.glob("*.json")))
    gaps: dict[str, dict[int, float]] = {}
    for seed, by_recipe in losses.items():
        for recipe, loss in by_recipe.items():
            if recipe != "bf16" and "bf16" in by_recipe:
                gaps.setdefault(recipe, {})[seed] = (loss - by_recipe["bf16"]) / by_recipe["bf16"]
    summary = {recipe: summarize(by_seed) for recipe, by_seed in sorted(gaps.items())}
    for recipe, s in summary.items():
        print(f"{recipe:<21} " + " ".join(f"s{k} {v:+.2%}" for k, v in s["gap_by_seed"].items()))
        print(f"{'':<21} mean {s['mean_gap']:+.2%} (stdev {s['stdev_gap']:.2%}, bar +-{s['bar']:.2%}), "
              f"{s['most_on_one_side']} of {s['seeds']} on one side: "
              f"{'within noise' if s['within_noise'] else 'outside noise'}")
    args.out.write_text(json.dumps({"min_bar": MIN_BAR, "final_loss": losses, "recipes": summary}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
