"""Host time vs wall time per compiled MoE-block training step. The host time is the time to queue
20 steps while the GPU is held busy (so the host never waits on it); a wall time near it means the
step is bound by host work. For an A/B of two trees, run it once per tree on one machine:

    PYTHONPATH=. python benchmarks/probe_step_host.py qwen3_30b:bf16 qwen3_30b:mxfp8 [--out FILE]
    PYTHONPATH=OTHER_TREE python benchmarks/probe_step_host.py ...
"""
import argparse, json, pathlib, sys, time
import torch
ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "examples")); sys.path.insert(0, str(ROOT / "benchmarks"))
import mxfp8_inductor  # noqa: E402  (from PYTHONPATH: the tree under test)
from shapes import block_and_inputs  # noqa: E402


def host_and_wall_ms(shape: str, recipe: str, steps: int = 20, repeats: int = 3) -> tuple[float, float]:
    torch._dynamo.reset()
    block, x, counts, grad = block_and_inputs(shape)
    fn = torch.compile(block) if recipe == "bf16" else torch.compile(block, backend="mxfp8", options={"recipe": recipe})

    def step():
        fn(x, counts).backward(grad)

    for _ in range(3):
        step()
    host, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(4e9))  # a few seconds of GPU work ahead of the queued steps
        start = time.perf_counter()
        for _ in range(steps):
            step()
        host.append((time.perf_counter() - start) / steps * 1e3)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - start) / steps * 1e3)
    return sorted(host)[repeats // 2], sorted(wall)[repeats // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="SHAPE:RECIPE, recipe bf16, mxfp8 or fp8_rowwise")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        shape, recipe = case.split(":")
        host, wall = host_and_wall_ms(shape, recipe)
        rows.append({"shape": shape, "recipe": recipe, "host_ms": round(host, 3), "wall_ms": round(wall, 3)})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "package": mxfp8_inductor.__file__}
        args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
