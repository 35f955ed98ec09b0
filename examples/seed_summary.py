"""The training-parity bar over every seed: each recipe's final loss against the bf16 run of the
same seed, per seed and on average.

    python examples/seed_summary.py [--out examples/results/convergence_seeds_h200.json]

Reads the 1000-step single-GPU summaries of train_moe.py in examples/results (one seed per file or
per recipe; runs with weights nudged by --init-noise are left out: they measure bf16's own spread).
One run per recipe cannot resolve the 1.0% bar (two bf16 runs 1e-3 apart end 0.75% apart), so the
bar is read on the mean over seeds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from train_moe import _tail_mean  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
BAR = 0.01


def final_losses(paths: list[pathlib.Path]) -> dict[int, dict[str, float]]:
    """{seed: {recipe: mean loss of the last 100 steps}} over the 1000-step one-GPU runs."""
    out: dict[int, dict[str, float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        cfg = data.get("config")
        if cfg is None:  # not a train_moe.py summary (this script's own output, for one)
            continue
        if data["steps"] != 1000 or cfg.get("init_noise") or cfg["world_size"] != 1:
            continue
        for recipe, r in data["recipes"].items():
            if len(r["loss"]) == 1000:
                out.setdefault(cfg["seed"], {})[recipe] = _tail_mean(r["loss"])
    return dict(sorted(out.items()))


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
    summary = {}
    for recipe, by_seed in gaps.items():
        vals = list(by_seed.values())
        summary[recipe] = {"gap_by_seed": by_seed, "mean_gap": statistics.fmean(vals),
                           "stdev_gap": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                           "seeds_within_bar": sum(v <= BAR for v in vals), "seeds": len(vals)}
        print(f"{recipe:<12} " + " ".join(f"s{s} {v:+.2%}" for s, v in by_seed.items()))
        s = summary[recipe]
        verdict = "within" if s["mean_gap"] <= BAR else "missed"
        print(f"{'':<12} mean {s['mean_gap']:+.2%} (stdev {s['stdev_gap']:.2%}, bar {BAR:.1%}: {verdict}), "
              f"{s['seeds_within_bar']} of {s['seeds']} seeds within")
    args.out.write_text(json.dumps({"bar": BAR, "final_loss": losses, "recipes": summary}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
