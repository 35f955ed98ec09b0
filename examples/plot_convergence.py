"""Loss curves per recipe from a train_moe.py summary JSON: a moving average of 20 steps over a
faint raw line, median step time in the legend.

    python examples/plot_convergence.py [--inp examples/results/convergence_h200_seed0.json] [--out ....png]
    (needs matplotlib, a plotting-only dependency)
"""

from __future__ import annotations

import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


def moving_average(xs: list[float], n: int = 20) -> list[float]:
    """Trailing mean over up to `n` values (shorter at the start, so it has one value per step)."""
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x - (xs[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


def plot(data: dict, out: pathlib.Path) -> None:
    ref = data["recipes"].get("bf16")
    # the curves of the recipes overlap at this scale: a second panel shows their smoothed gap
    fig, axes = plt.subplots(2 if ref else 1, 1, figsize=(8, 6 if ref else 4.5), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1] if ref else [1]})
    ax = axes[0, 0]
    for i, (recipe, r) in enumerate(data["recipes"].items()):
        color = f"C{i}"
        steps = range(len(r["loss"]))
        ax.plot(steps, r["loss"], color=color, alpha=0.15, linewidth=0.6)
        ax.plot(steps, moving_average(r["loss"]), color=color, linewidth=1.5,
                label=recipe)
        if ref and recipe != "bf16":
            n = min(len(r["loss"]), len(ref["loss"]))
            gap = [(a - b) / b for a, b in zip(moving_average(r["loss"][:n]), moving_average(ref["loss"][:n]))]
            axes[1, 0].plot(range(n), [100 * g for g in gap], color=color, linewidth=1.2, label=recipe)
    if ref:
        axes[1, 0].axhline(0, color="gray", linewidth=0.8)
        axes[1, 0].set_ylabel("vs bf16 (%)")
        axes[1, 0].grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte), 20-step moving average")
    cfg = data["config"]
    ax.set_title(f"{data['gpu']}, torch {data['torch']}, {data['date']}, {data['steps']} steps\n"
                 f"{cfg['layers']} layers, d {cfg['dim']}, {cfg['experts']} experts top-{cfg['top_k']}, "
                 f"hidden {cfg['hidden']}, {cfg['batch']}x{cfg['seq']} tokens/step", fontsize=10)
    losses = [x for r in data["recipes"].values() for x in r["loss"]]
    if losses:  # the first steps (ln 256 = 5.5) would flatten the interesting part
        tail = sorted(losses)[int(0.98 * (len(losses) - 1))]
        ax.set_ylim(min(losses) * 0.95, min(max(losses), tail * 1.5))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inp", type=pathlib.Path, default=RESULTS / "convergence_h200_seed0.json")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS / "convergence_h200.png")
    args = p.parse_args(argv)
    plot(json.loads(args.inp.read_text()), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
