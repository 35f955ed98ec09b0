"""Every GPU kernel of one whole compiled training step (forward, loss, backward, AdamW) of a model
at real per-layer dimensions, each classified and with the bytes it moves: the evidence for "no
kernel reads a bf16 activation back only to quantize it". Zero `quant_only` kernels on
activation operands is the bar.

    python benchmarks/profile_layer.py qwen3_30b:bf16 qwen3_30b:fp8_rowwise titan_dsv3_16b:auto
        [--layers 1] [--microbatches 1] [--warmup 2] [--top 20] [--keep-sources DIR]
        [--out benchmarks/results/profile_layer_h200.json]
    python benchmarks/profile_layer.py --table benchmarks/results/profile_layer_h200.json
    python benchmarks/profile_layer.py qwen3_30b:fp8_rowwise --tiny --device cpu   # the script itself, on a CPU

MODEL is one of bench_models.py's (`MODELS`, and TorchTitan's `titan_*`), built by its `build` /
`build_titan` and compiled as it compiles them: bf16 under plain torch.compile, a recipe
(fp8_rowwise, fp8_blockwise, mxfp8, auto) under backend="mxfp8", with "+cache" for
weight_cache=True and "+all" for targets="all". Each MODEL:VARIANT runs in a fresh process with
Inductor's cache pointed at a fresh directory (as profile_moe_block.py does), so every Triton
kernel Inductor launches has its source there; after --warmup steps (the first compiles) one
step is profiled (CPU and CUDA activity, shapes recorded).

Each kernel's class:
  gemm            Inductor kernels with a `tl.dot` (its mm templates); the package's GEMM kernels
                  (every `@triton.jit`/`@gluon.jit` function of kernels/triton_fp8_gemm.py,
                  gluon_fp8_gemm.py, triton_mx_gemm.py; the last quantizes its bf16 operands in
                  registers); library kernels named like cuBLAS/CUTLASS/nvjet GEMMs (attention
                  kernels excepted: `other`).
  quant_only      the package's quantizers (every jit function of kernels/triton_rowwise.py,
                  triton_mx_quant.py, triton_mx_scale_layout.py); an Inductor kernel that stores
                  float8 (its signature has an fp8 output pointer) and does no producer work:
                  no transcendental or activation math (exp, sigmoid, tanh, erf, log, sqrt,
                  rsqrt, sin, cos), no sum/Welford reduction, no gather or scatter (an index
                  loaded from memory, a bounds assert, an atomic); and an Inductor kernel that
                  stores no float8 and no 16-bit tensor, takes an abs-max reduction and does no
                  producer work (the scale half of a two-kernel quantization). Anything else an
                  fp8 kernel does (an add, a multiply, a second input) does not make it a
                  producer: the heuristic errs towards quant_only, and `note` says what it saw.
  producer+quant  an Inductor kernel that stores float8 and does producer work (SwiGLU, a norm, a
                  token gather), named in `note`.
  other           everything else (attention, elementwise, reductions, copies, the optimizer).
A quantizing kernel's operand is "weight" where a tensor it takes has a parameter's shape (or
its last two dims swapped): an Inductor kernel's own arguments; for a package kernel, whose
arguments the profiler does not see, the first tensor of the package op that launched it (also
where 3-D: the package's ops take activations as [tokens, features], expert weights and their
slices as [E, K, N]), or where the kernel's or op's name says weight (not weight_grad) or
matrix. Where no shapes were recorded (a GPU profile's Inductor kernels, C++ kernels): a
quantization-only kernel where "transpose" is in its name or fused ATen ops (each expert weight
enters its GEMM as a `.transpose(-2, -1)` view); a producer's never (backward kernels fuse
transposes of activations, and a weight has no producer in the graph). Else "activation".

Bytes: Inductor estimates each of its kernels' traffic at compile time (`kernel_num_gb` in its
`inductor_meta`, emitted with `torch._inductor.config.benchmark_kernel`, which this script
sets): the bytes of the buffers the kernel reads and writes, at the sizes compiled (a dynamic
size at its hint). Every other kernel (library GEMMs, aten kernels, the package's Triton kernels,
copies) has `gb` null, and no GB/s. On a CPU (--device cpu) the "kernels" are operators and
Inductor's C++ kernels, timed by their self CPU time, with no bytes.

Output: per MODEL:VARIANT the kernel time and bytes per class, quant_only on activations
separately, and the kernels (every quant_only and producer+quant one, then the --top others by
time); --out gets them all, with the GPU, versions, date and command line; --table reprints a
saved file (no GPU).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import sys

import torch
from bench_models import build_training, run_worker
from shapes import card

CLASSES = ("gemm", "quant_only", "producer+quant", "other")
KERNELS = pathlib.Path(__file__).resolve().parents[1] / "mxfp8_inductor" / "kernels"
GEMM_MODULES = ("triton_fp8_gemm", "gluon_fp8_gemm", "triton_mx_gemm")
QUANT_MODULES = ("triton_rowwise", "triton_mx_quant", "triton_mx_scale_layout")
# a package kernel or op whose name says it quantizes a weight (not a weight gradient's operands)
WEIGHT_HINT = re.compile(r"weight(?!_grad)|matrix")
JIT_DEF = re.compile(r"@(?:triton|gluon)\.jit\b[^\n]*\n(?:\s*@[^\n]*\n)*\s*def (\w+)")

LIBRARY_GEMM = re.compile(r"gemm|gemv|cutlass|nvjet|xmma|cublas|splitKreduce", re.IGNORECASE)
ATTENTION = re.compile(r"flash|fmha|attention|attn", re.IGNORECASE)
CPU_GEMM = re.compile(r"^aten::(_?grouped_mm|mm|addmm|bmm|baddbmm|_scaled_mm|_scaled_grouped_mm)$")

# Inductor's generated sources, in the graph modules of its cache: each kernel's definition is
# preceded by comments naming its file (Triton) and the ATen ops it fused
CPP_SOURCE = re.compile(r"(\w+) = async_compile\.cpp_pybinding\(\[[^\]]*\], r'''(.*?)'''", re.DOTALL)
KERNEL_PATH = re.compile(r"# kernel path: (\S+)")
NUM_GB = re.compile(r"'kernel_num_gb': ([0-9.eE+-]+)")
POINTER = re.compile(r"'((?:in_out|in|out)_ptr\d+)': '\*(\w+)'")  # Triton signature entries
CPP_POINTER = re.compile(r"(const )?(?:at::)?(\w+)\* ((?:in_out|in|out)_ptr\d+)")
PRODUCER_MATH = re.compile(r"\b(exp|expm1|sigmoid|tanh|erfc?|erfinv|log|log1p|sqrt|rsqrt|sin|cos|sum2?|"
                           r"welford\w*|cumsum)\b")
INDEX_CHECK = re.compile(r"index out of bounds|atomic_", re.IGNORECASE)
LOAD_ADDRESS = re.compile(r"tl\.(?:load|store)\(([^,]*)")


def jit_names(modules: tuple[str, ...]) -> set[str]:
    """The Triton/Gluon jit functions the package's kernel `modules` define (a launched one's
    CUDA kernel has its name)."""
    return {name for m in modules for name in JIT_DEF.findall((KERNELS / f"{m}.py").read_text())}


# ---------------------------------------------------------------------------------------------
# Inductor's kernel sources


class Source:
    """One kernel Inductor generated: its source, the graph-module comments above it (the ATen
    ops it fused) and what the source shows."""

    def __init__(self, name: str, text: str, comments: str, language: str) -> None:
        self.name, self.text, self.comments, self.language = name, text, comments, language
        if language == "triton":
            pointers = POINTER.findall(text)  # (argument, type); the outputs are (in_)out_ptr
            start = text.find("def triton_")
            body = text[start:text.find("def get_args", start) if "def get_args" in text else None]
            addresses = LOAD_ADDRESS.findall(body)
            self.gather = any(re.search(r"\btmp\d", a) for a in addresses) or bool(INDEX_CHECK.search(body))
            outputs = [t for arg, t in pointers if arg.startswith(("out", "in_out"))]
            inputs = [t for arg, t in pointers if arg.startswith("in_ptr")]
        else:
            pointers = CPP_POINTER.findall(text)  # (const, type, argument); the outputs are not const
            body = text[text.find("kernel("):]
            self.gather = bool(INDEX_CHECK.search(body))
            outputs = [t for const, t, _ in pointers if not const]
            inputs = [t for const, t, _ in pointers if const]
        half = ("bf16", "fp16", "bfloat16", "half")
        self.fp8_out = any("fp8" in t.lower() or "float8" in t.lower() for t in outputs)
        self.half_out = any(t.lower() in half for t in outputs)
        self.half_in = sum(t.lower() in half for t in inputs)
        self.math = sorted(set(PRODUCER_MATH.findall(body)))
        self.dot = "tl.dot(" in body
        self.amax = ("abs(" in body) and bool(re.search(r"max2\(|max_propagate_nan|vec_reduce", body))
        num_gb = NUM_GB.search(text)
        self.num_gb = float(num_gb.group(1)) if num_gb else None

    def classify(self) -> tuple[str, str]:
        """(class, note): the module docstring's rules."""
        producer = [f"math: {', '.join(self.math)}"] * bool(self.math) + ["gather/scatter"] * self.gather
        seen = [f"reads {self.half_in} 16-bit tensors"] * (self.half_in > 1)
        if self.dot:
            return "gemm", ""
        if self.fp8_out:
            return ("producer+quant" if producer else "quant_only"), "; ".join(producer + seen)
        if self.amax and not producer and not self.half_out:
            return "quant_only", "abs-max only"
        return "other", ""

    def says_transpose(self) -> bool:
        return "transpose" in self.name or "aten.transpose" in self.comments or "aten.permute" in self.comments


def inductor_sources(cache_dir: str) -> tuple[dict[str, Source], dict[str, list[Source]]]:
    """Every kernel of the graph modules in Inductor's cache, by its file (Triton kernels) and by
    name (names repeat across graphs)."""
    from profile_moe_block import KERNEL_SOURCE  # imported here: its import points Inductor's cache

    by_path: dict[str, Source] = {}
    by_name: dict[str, list[Source]] = collections.defaultdict(list)
    for path in pathlib.Path(cache_dir).rglob("*.py"):
        text = path.read_text(errors="replace")
        for language, pattern in (("triton", KERNEL_SOURCE), ("cpp", CPP_SOURCE)):
            for m in pattern.finditer(text):
                above = text[text.rfind("\n\n", 0, m.start()) + 1:m.start()]
                comments = "\n".join(line for line in above.splitlines() if line.startswith("#"))
                source = Source(m.group(1), m.group(2), comments, language)
                by_name[source.name].append(source)
                if kernel_path := KERNEL_PATH.search(comments):
                    by_path[kernel_path.group(1)] = source
    return by_path, by_name


# ---------------------------------------------------------------------------------------------
# Classifying the profile's kernels


def _param_shaped(shapes: list, param_shapes: set[tuple[int, ...]]) -> bool | None:
    """Whether a tensor among `shapes` (the profiler's recorded input shapes) has a parameter's
    shape; None where no tensor shape was recorded."""
    tensors = [tuple(s) for s in shapes or () if isinstance(s, (list, tuple)) and s
               and all(isinstance(d, int) for d in s)]
    return any(s in param_shapes for s in tensors) if tensors else None


def classify(name: str, op, sources: tuple[dict, dict], param_shapes: set, package: dict[str, set]) -> dict:
    """One launch of kernel `name` by CPU event `op` (the innermost operator around its launch,
    Inductor's own record for its kernels; None where unknown): its class, operand, origin,
    bytes per launch and a note."""
    by_path, by_name = sources
    kwinputs = getattr(op, "kwinputs", None) or {}
    source = by_path.get(kwinputs.get("kernel_file", ""))
    candidates = by_name.get(re.sub(r"^graph_\d+_", "", name), [])
    if source is None and candidates:
        source = candidates[0]
    row = {"name": name, "op": op.name if op is not None and op.name != name else None, "operand": None,
           "gb": None, "note": ""}
    if source is not None:
        cls, row["note"] = source.classify()
        if candidates and source is candidates[0] and len({s.classify()[0] for s in candidates}) > 1:
            row["note"] = f"name shared by {len(candidates)} kernels of different classes; {row['note']}"
        gb = kwinputs.get("kernel_num_gb", source.num_gb)
        row.update(origin="inductor", file=kwinputs.get("kernel_file"), gb=float(gb) if gb else None)
        if cls in ("quant_only", "producer+quant"):
            weight = _param_shaped(op.input_shapes if op is not None else None, param_shapes)
            if weight is None:  # a weight has no producer in the graph: only a cast of it can be its
                weight = cls == "quant_only" and source.says_transpose()
            row["operand"] = "weight" if weight else "activation"
        return {**row, "class": cls}
    if name in package["gemm"]:
        return {**row, "class": "gemm", "origin": "mxfp8_inductor"}
    # the package's quantizers; on a CPU, its quantizing ops (their kernels are aten's)
    if name in package["quant"] or name.startswith("mxfp8::") and "quantize" in name:
        first = next((s for s in (op.input_shapes if op is not None else ()) if s), None)
        weight = (bool(WEIGHT_HINT.search(name) or op is not None and WEIGHT_HINT.search(op.name))
                  or bool(first and (len(first) >= 3 or _param_shaped([first], param_shapes))))
        return {**row, "class": "quant_only", "origin": "mxfp8_inductor",
                "operand": "weight" if weight else "activation"}
    gemm = CPU_GEMM.match(name) or (LIBRARY_GEMM.search(name) and not ATTENTION.search(name))
    return {**row, "class": "gemm" if gemm else "other", "origin": "library"}


def kernel_rows(prof, device: str, sources: tuple[dict, dict], param_shapes: set) -> list[dict]:
    """The profiled step's kernels, one row per kernel (name and Inductor file) and operand,
    classified; `op` is the operator that launched its first call."""
    from torch.autograd import DeviceType

    package = {"gemm": jit_names(GEMM_MODULES), "quant": jit_names(QUANT_MODULES)}
    events = prof.events()
    launches = []  # (kernel name, launching op, microseconds)
    if device == "cuda":
        # operators (a launch's own CPU event is linked to one; operators are linked to none)
        ops = {e.id: e for e in events
               if e.device_type == DeviceType.CPU and not getattr(e, "linked_correlation_id", 0)}
        for e in events:
            if e.device_type == DeviceType.CUDA:
                link = getattr(e, "linked_correlation_id", None)
                launches.append((e.name, ops.get(link) if link else None, e.time_range.elapsed_us()))
    else:  # operators and Inductor's C++ kernels (config.cpp.enable_kernel_profile), by self time
        for e in events:
            if re.match(r"^\w+::\w+$", e.name) or "cpp_fused" in e.name:
                launches.append((e.name, e, e.self_cpu_time_total))
    rows: dict[tuple, dict] = {}
    for name, op, us in launches:
        info = classify(name, op, sources, param_shapes, package)
        # a kernel launched for several operands (or, quantizing, by several ops) gets a row for each
        key = (name, info.get("file"), info["operand"], info["op"] if info["operand"] else None)
        row = rows.setdefault(key, {**info, "calls": 0, "ms": 0.0, "gb": None})
        row["calls"] += 1
        row["ms"] += us / 1e3
        if info["gb"] is not None:
            row["gb"] = (row["gb"] or 0.0) + info["gb"]
    out = sorted(rows.values(), key=lambda r: -r["ms"])
    for r in out:
        r["gbps"] = r["gb"] / (r["ms"] / 1e3) if r["gb"] is not None and r["ms"] > 0 else None
        r.pop("file", None)
    return out


def totals(rows: list[dict]) -> dict[str, dict]:
    """Per class: kernels, calls, ms, and GB over the kernels whose bytes are known."""
    out = {}
    for c in CLASSES:
        mine = [r for r in rows if r["class"] == c]
        out[c] = {"kernels": len(mine), "calls": sum(r["calls"] for r in mine), "ms": sum(r["ms"] for r in mine),
                  "gb": sum(r["gb"] for r in mine if r["gb"] is not None),
                  "ms_without_gb": sum(r["ms"] for r in mine if r["gb"] is None)}
    return out


# ---------------------------------------------------------------------------------------------
# One run (a fresh process)


def worker(args: argparse.Namespace) -> dict:
    """Build, compile, warm up and profile one step of args.spec (MODEL:VARIANT), in this process."""
    import profile_moe_block  # noqa: F401  its import points Inductor's cache at a fresh directory
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    fresh = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    if args.keep_sources:
        kept = args.keep_sources.resolve() / re.sub(r"[:+]", "_", args.spec)
        if kept.exists():  # its sources would be taken for this run's
            raise SystemExit(f"{kept} exists: give --keep-sources a new directory")
        shutil.rmtree(fresh, ignore_errors=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(kept)
    inductor_config.benchmark_kernel = True  # each Triton kernel's kernel_num_gb in its inductor_meta
    inductor_config.cpp.enable_kernel_profile = True  # each C++ kernel a profiler event (CPU runs)

    model_name, variant = args.spec.split(":")
    recipe, *flags = variant.split("+")
    if set(flags) - {"all", "cache"} or recipe == "torchao":
        raise SystemExit(f"{args.spec}: a variant is bf16 or a recipe, with +all and +cache")
    model, train_step, tokens = build_training(model_name, variant, args.layers, args.device, args.tiny,
                                               args.microbatches)
    param_shapes = {s for p in model.parameters() if p.dim() >= 2
                    for s in (tuple(p.shape), (*p.shape[:-2], p.shape[-1], p.shape[-2]))}

    def step() -> None:  # bench_models.py's step, waited for
        train_step()
        if args.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (args.device == "cuda")
    with profile(activities=activities, record_shapes=True) as prof:
        step()
    rows = kernel_rows(prof, args.device, inductor_sources(os.environ["TORCHINDUCTOR_CACHE_DIR"]), param_shapes)
    if not args.keep_sources:
        shutil.rmtree(fresh, ignore_errors=True)
    bar = [r for r in rows if r["class"] == "quant_only" and r["operand"] == "activation"]
    return {"model": model_name, "variant": variant, "layers": args.layers, "microbatches": args.microbatches,
            "tokens": tokens, "kernel_ms": sum(r["ms"] for r in rows), "classes": totals(rows),
            "quant_only_activation": {"kernels": len(bar), "ms": sum(r["ms"] for r in bar)}, "kernels": rows}


# ---------------------------------------------------------------------------------------------
# Reports


def report(p: dict, top: int) -> None:
    """Print one profile: per class, then quant_only on activations (the bar), then the kernels."""
    print(f"==== {p['model']} {p['variant']} (layers {p['layers']}, microbatches {p['microbatches']}, "
          f"tokens {p['tokens']}): kernels {p['kernel_ms']:.3f} ms/step")
    print(f"{'class':<15} {'kernels':>7} {'calls':>6} {'ms':>9} {'GB':>8}  (ms without bytes)")
    for c, t in p["classes"].items():
        print(f"{c:<15} {t['kernels']:>7} {t['calls']:>6} {t['ms']:9.3f} {t['gb']:8.3f}  ({t['ms_without_gb']:.3f})")
    bar = p["quant_only_activation"]
    print(f"quant_only on activations: {bar['kernels']} kernels, {bar['ms']:.3f} ms")
    quant = [r for r in p["kernels"] if r["class"] in ("quant_only", "producer+quant")]
    rest = [r for r in p["kernels"] if r not in quant][:top]
    print(f"{'ms':>9} {'calls':>5} {'GB':>8} {'GB/s':>6}  {'class':<14} {'operand':<10} kernel [launched by] note")
    for r in quant + rest:
        gb = f"{r['gb']:8.3f}" if r["gb"] is not None else f"{'-':>8}"
        gbps = f"{r['gbps']:6.0f}" if r["gbps"] is not None else f"{'-':>6}"
        op = f" [{r['op']}]" if r["op"] else ""
        note = f"  ({r['note']})" if r["note"] else ""
        print(f"{r['ms']:9.3f} {r['calls']:5d} {gb} {gbps}  {r['class']:<14} {r['operand'] or '':<10} "
              f"{r['name'][:90]}{op}{note}")
    if len(p["kernels"]) > len(quant) + len(rest):
        print(f"  ... {len(p['kernels']) - len(quant) - len(rest)} more kernels (--top, or the JSON file)")
    print(flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("specs", nargs="*", metavar="MODEL:VARIANT")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2, help="steps before the profiled one (the first compiles)")
    p.add_argument("--top", type=int, default=20, help="kernels printed besides the quantizing ones")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny dimensions: check the script on a CPU")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per MODEL:VARIANT")
    p.add_argument("--keep-sources", type=pathlib.Path, metavar="DIR",
                   help="keep each run's Inductor cache (the kernels' sources) under DIR/MODEL_VARIANT")
    p.add_argument("--out", type=pathlib.Path, help="default benchmarks/results/profile_layer_<card>.json")
    p.add_argument("--table", type=pathlib.Path, metavar="JSON", help="print a saved file's profiles (no GPU)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.table:
        for profile in json.loads(args.table.read_text())["profiles"]:
            report(profile, args.top)
        return
    if not args.specs:
        p.error("give MODEL:VARIANT runs to profile, or --table JSON")
    out = args.out or pathlib.Path(f"benchmarks/results/profile_layer_{card(args.device)}.json")
    versions = {name: importlib.metadata.version(name) for name in ("triton", "transformers", "torchtitan")
                if importlib.util.find_spec(name)}
    meta = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            **versions, "date": datetime.date.today().isoformat(),
            "command": shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["python", __file__, *argv])}
    profiles, failed = [], []
    for spec in args.specs:
        cmd = [sys.executable, __file__, "--worker", "--spec", spec, "--layers", str(args.layers),
               "--microbatches", str(args.microbatches), "--warmup", str(args.warmup), "--device", args.device,
               *(["--tiny"] if args.tiny else []),
               *(["--keep-sources", str(args.keep_sources)] if args.keep_sources else [])]
        profile, error = run_worker(cmd, args.timeout)
        if error:
            failed.append({"spec": spec, "error": error})
            print(f"{spec}: {error}", flush=True)
        else:
            profiles.append(profile)
            report(profile, args.top)
        out.parent.mkdir(parents=True, exist_ok=True)  # what has run survives a stopped run
        out.write_text(json.dumps({**meta, "profiles": profiles, "failed": failed}, indent=1) + "\n")
    print(f"wrote {out}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
