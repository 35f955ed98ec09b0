"""Training parity over seeds: each recipe's final loss against the bf16 run of the same seed, and
the noise floor (bf16 with its initial weights nudged, against bf16) measured the same way.

    python examples/seed_summary.py [--out examples/results/convergence_seeds_h200.json]

Reads the 1000-step one-GPU summaries of train_moe.py in examples/results. Each recipe, the noise
floor included, gets a two-sided paired t-test (scipy.stats.ttest_rel) of its final losses against
bf16's over the seeds they share; it is within noise when p >= 0.05, that is when the 95% confidence
interval of the mean loss difference holds zero. Each row is a test of its own: with five rows, the
chance that at least one of five recipes equal to bf16 reads outside noise is 23%. Within noise is
not equivalence: the interval says how large a gap the seeds leave possible.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from scipy import stats

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from train_moe import _tail_mean  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
ALPHA = 0.05
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


def summarize(pairs: dict[int, tuple[float, float]]) -> dict:
    """The relative gaps and the paired t-test of {seed: (recipe loss, bf16 loss)}; with one seed,
    no test (t, p, ci95 and within_noise are None)."""
    gaps = {seed: (loss - ref) / ref for seed, (loss, ref) in pairs.items()}
    vals = list(gaps.values())
    n = len(vals)
    out = {"gap_by_seed": gaps, "mean_gap": statistics.fmean(vals), "stdev_gap": None, "seeds": n,
           "t": None, "p": None, "ci95": None, "within_noise": None}
    if n > 1:
        out["stdev_gap"] = statistics.stdev(vals)
        test = stats.ttest_rel([loss for loss, _ in pairs.values()], [ref for _, ref in pairs.values()])
        ci = test.confidence_interval(1 - ALPHA)
        out.update(t=float(test.statistic), p=float(test.pvalue), ci95=[float(ci.low), float(ci.high)],
                   within_noise=bool(test.pvalue >= ALPHA))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=pathlib.Path, default=RESULTS, help="folder of train_moe.py summaries")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS / "convergence_seeds_h200.json")
    args = p.parse_args(argv)
    losses = final_losses(sorted(args.results.glob("*.json")))
    pairs: dict[str, dict[int, tuple[float, float]]] = {}
    for seed, by_recipe in losses.items():
        for recipe, loss in by_recipe.items():
            if recipe != "bf16" and "bf16" in by_recipe:
                pairs.setdefault(recipe, {})[seed] = (loss, by_recipe["bf16"])
    summary = {recipe: summarize(by_seed) for recipe, by_seed in sorted(pairs.items())}
    for recipe, s in summary.items():
        print(f"{recipe:<21} " + " ".join(f"s{k} {v:+.2%}" for k, v in s["gap_by_seed"].items()))
        if s["p"] is None:
            print(f"{'':<21} one seed: no test")
            continue
        print(f"{'':<21} mean {s['mean_gap']:+.2%} (stdev {s['stdev_gap']:.2%}) over {s['seeds']} seeds; paired "
              f"t-test t {s['t']:+.2f}, p {s['p']:.2f}, 95% CI of the loss gap "
              f"[{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}]: {'within noise' if s['within_noise'] else 'outside noise'}")
    test = f"two-sided paired t-test (scipy.stats.ttest_rel) of final losses against bf16's; within noise: p >= {ALPHA}"
    args.out.write_text(json.dumps({"test": test, "alpha": ALPHA, "final_loss": losses, "recipes": summary},
                                   indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
