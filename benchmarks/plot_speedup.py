"""Bar charts of bf16 time / recipe time: per MoE block shape (moe_block_h200.json, with the
targets) and per whole model, per layer (models_h200.json).

    python benchmarks/plot_speedup.py --out-dir benchmarks/results [--block JSON] [--models JSON]

(needs matplotlib, a plotting-only dependency: pip install -e '.[examples]')
"""

import argparse
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


def bars(rows: list[dict], group: str, series: str, title: str, out: pathlib.Path, targets: dict | None = None) -> None:
    """One bar per (group, series) of rows' "speedup", dashes at the targets."""
    groups = list(dict.fromkeys(r[group] for r in rows))
    names = list(dict.fromkeys(r[series] for r in rows))
    fig, ax = plt.subplots(figsize=(min(14.0, max(7.0, 0.3 * len(groups) * len(names))), 4.0))
    width = 0.8 / len(names)
    tab20 = plt.get_cmap("tab20").colors  # tab10 repeats past ten series; dark shades first
    colors = tab20[::2] + tab20[1::2]
    for i, name in enumerate(names):
        speed = {r[group]: r["speedup"] for r in rows if r[series] == name}
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, [speed.get(g, 0) for g in groups], width, label=name, color=colors[i % len(colors)])
        for x, g in zip(xs, groups):
            if g in (targets or {}).get(name, {}):
                ax.hlines(targets[name][g], x - width / 2, x + width / 2, colors="k", linestyles="--")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([g + width * (len(names) - 1) / 2 for g in range(len(groups))], groups)
    ax.set_ylabel("bf16 time / recipe time")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block", type=pathlib.Path, default=RESULTS / "moe_block_h200.json",
                   help="bench_moe_block.py JSON")
    p.add_argument("--models", type=pathlib.Path, default=RESULTS / "models_h200.json", help="bench_models.py JSON")
    p.add_argument("--out-dir", type=pathlib.Path, required=True, help="where the two PNGs go")
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    block = json.loads(args.block.read_text())
    bars(block["rows"], "shape", "recipe", f"MoE block fwd+bwd on {block['gpu']} ({block['date']}), dashes: targets",
         args.out_dir / "moe_block_speedup_h200.png", TARGETS)
    models = json.loads(args.models.read_text())
    rows = [r for r in models["rows"] if r["variant"] != "bf16"]
    bars(rows, "model", "variant", f"Whole-model training step, per layer, on {models['gpu']} ({models['date']})",
         args.out_dir / "models_speedup_h200.png")


if __name__ == "__main__":
    main()
