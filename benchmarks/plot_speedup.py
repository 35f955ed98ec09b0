"""Bar chart of bf16 time / recipe time per MoE shape from moe_block_h200.json, with the targets.

    python benchmarks/plot_speedup.py  (needs matplotlib, a plotting-only dependency)
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
TARGETS = {
    "mxfp8": {"dsv3": 0.90, "l4scout": 0.93, "qwen3_30b": 0.75, "fine64": 0.72},
    "fp8_rowwise": {"dsv3": 1.30, "l4scout": 1.45, "qwen3_30b": 1.10, "fine64": 1.15},
}


def main() -> None:
    data = json.loads((RESULTS / "moe_block_h200.json").read_text())
    rows = data["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(recipes)
    for i, recipe in enumerate(recipes):
        speed = {r["shape"]: r["speedup"] for r in rows if r["recipe"] == recipe}
        xs = [s + i * width for s in range(len(shapes))]
        ax.bar(xs, [speed.get(s, 0) for s in shapes], width, label=f"{recipe} (measured)")
        for x, shape in zip(xs, shapes):
            if shape in TARGETS.get(recipe, {}):
                ax.hlines(TARGETS[recipe][shape], x - width / 2, x + width / 2, colors="k", linestyles="--")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([s + width * (len(recipes) - 1) / 2 for s in range(len(shapes))], shapes)
    ax.set_ylabel("bf16 time / recipe time")
    ax.set_title(f"MoE block fwd+bwd on {data['gpu']} ({data['date']}), dashes: targets", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "moe_block_speedup_h200.png", dpi=120)


if __name__ == "__main__":
    main()
