"""`recipe="auto"` by measurement: each GEMM role's candidate implementations timed on the device
at the GEMM's shape, quantization included (docs/design.md, "recipe='auto'").

Candidates are bf16 and every FP8 recipe that multiplies in FP8 on this device
(`routes.FP8_MMA`): an emulated recipe multiplies in bf16 after its quantization, so it cannot
beat bf16 and is not timed. What is timed is the role's eager implementation (the recipe module's
function with decomposing=False) on random operands of the GEMM's shape, in uniform token groups,
the weight stored [E, N, K] as models store it; its quantization is made in every call, or with
the weight cache on, reused as between two optimizer steps. `compiled`: the role as a compiled
model runs it, where fp8_rowwise's forward and input gradient take their activation already in
FP8 rows, since Inductor fuses that quantization into the kernel producing the activation; they
pay its extra write there (the float8 rows and scales beside the bf16 output), timed as a write
of those bytes. Every other quantization (weights, the weight gradient's token groups, mxfp8's
activations, which its ops keep opaque) costs in a compiled model what it costs eagerly. A time is
the call's GPU time plus its host time (`_bench`): blocks of short GEMMs are bound by the host.
Under CUDA graphs (`graphs`) a call that a replay repeats costs no host time, and is timed on the
GPU alone; the ops that reuse a weight, and native MXFP8's forward and input-gradient ops, run
between the graphs and keep their host time.

Times are kept per process and on disk in Inductor's cache directory, keyed by the GPU, the
torch, Triton and package versions and the GEMM, so a shape is timed once per machine.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
import tempfile
import threading
import time

import torch

from .. import routes
from .._version import __version__
from ..spec import GemmSpec, Impl, Role
from . import rowwise
from .impls import method

_lock = threading.Lock()
_times: dict[str, float] | None = None  # the disk cache's content, loaded on first use


def measurable(device: torch.device | None) -> bool:
    """Whether GEMMs can be timed on `device` now: a CUDA GPU whose current stream is not being
    captured into a CUDA graph (timing launches work the capture would record)."""
    return device is not None and device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def candidates(device: torch.device, K: int, N: int, tokens_per_group: float | None) -> list[str]:
    """bf16 and the FP8 recipes whose GEMMs on `device` multiply in FP8 at this shape."""
    fp8 = [r for r in ("fp8_rowwise", "mxfp8") if routes.route(r, device, K, N, tokens_per_group) in routes.FP8_MMA]
    return ["bf16", *fp8]


def _path() -> pathlib.Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return pathlib.Path(cache_dir()) / "mxfp8_inductor" / "gemm_times.json"


def _usable(ms: object) -> bool:
    """Whether a time read from the file can be compared: a finite positive number. JSON holds NaN,
    Infinity and true (a bool is an int to Python) as well; any other entry is timed again."""
    return type(ms) in (int, float) and math.isfinite(ms) and ms > 0


def _load() -> dict[str, float]:
    global _times
    if _times is None:
        try:
            data = json.loads(_path().read_text())
        except (OSError, ValueError):  # none yet, or a torn write from another process
            data = {}
        _times = {k: float(v) for k, v in data.items() if _usable(v)} if isinstance(data, dict) else {}
    return _times


def _save(new: dict[str, float]) -> None:
    """Merge `new` into the file (read again first: other processes may have written), atomically."""
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            merged = json.loads(path.read_text())
            merged = merged if isinstance(merged, dict) else {}
        except (OSError, ValueError):
            merged = {}
        merged.update(new)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(merged, f, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only cache directory: the times stay in this process
        pass


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


@functools.cache
def _device_key(device: torch.device) -> str:
    import triton

    name = device_name(device)
    cap = ".".join(map(str, torch.cuda.get_device_capability(device))) if device.type == "cuda" else "-"
    return f"{name}|cc{cap}|torch {torch.__version__}|triton {triton.__version__}|mxfp8_inductor {__version__}"


def _bench(fn, host_fn=None, host: bool = True) -> float:
    """Milliseconds of `fn()` as a step of such calls pays it at worst: its GPU time (median of
    `triton.testing.do_bench`) plus, with `host`, its host time per call (of `host_fn()` where
    given: `fn` less the launches that stand in for another kernel's work). A block of short GEMMs
    is bound by its host, which then pays each call's host time in full; do_bench alone does not
    show it, since the cache flush it runs before each call keeps the GPU busy meanwhile. Counted
    for every candidate, so an FP8 role wins only where its GEMM's gain exceeds the host time it
    adds; `host=False` for a call a CUDA graph replays."""
    import triton.testing

    gpu_ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    return gpu_ms + _host_ms(host_fn or fn) if host else gpu_ms


def _host_ms(fn, calls: int = 10, turns: int = 3) -> float:
    """Host milliseconds per call of `fn()`, calls queued back to back while the GPU runs behind;
    the lowest of `turns` runs (a busy host only ever adds time)."""
    best = math.inf
    for _ in range(turns):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    torch.cuda.synchronize()
    return best


def _operands(role: str, M: int, K: int, N: int, E: int, dense: bool, cached: bool, device: torch.device):
    """Random operands of one role's call, as the op makes it (lowering/dispatch.py)."""
    x_MK = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    grad_MN = torch.randn(M, N, device=device, dtype=torch.bfloat16)
    if dense:
        w_NK = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K**0.5
        param = w_NK if cached else None
        return {"forward": (x_MK, w_NK, param), "input-grad": (grad_MN, w_NK, param),
                "weight-grad": (grad_MN, x_MK)}[role]
    w_ENK = torch.randn(E, N, K, device=device, dtype=torch.bfloat16) / K**0.5
    b_EKN, param = w_ENK.transpose(-2, -1), (w_ENK if cached else None)
    offs = (torch.arange(1, E + 1, device=device, dtype=torch.int64) * M // E).to(torch.int32)
    # the weight gradient of a weight stored [E, N, K]: the op's backward swaps the operands
    return {"forward": (x_MK, b_EKN, offs, param), "input-grad": (grad_MN, b_EKN, offs, param),
            "weight-grad": (x_MK, grad_MN, offs)}[role]


def _host_counted(recipe: str, role: str, cached: bool, graphs: bool) -> bool:
    """Whether a call pays host time: always outside CUDA graphs; under them only a forward or
    input-gradient call of an op that runs between the graphs (docs/design.md, "Weight cache"):
    one reusing the weight, or native MXFP8's, whose op stays opaque."""
    if not graphs:
        return True
    return recipe != "bf16" and role != Role.WEIGHT_GRAD and (cached or recipe == "mxfp8")


def times(recipes: list[str], role: str, M: int, K: int, N: int, E: int, *, dense: bool, rounding: str,
          cached: bool, compiled: bool, device: torch.device, graphs: bool = False) -> dict[str, float]:
    """Milliseconds of one GEMM role in each of `recipes` (see `candidates`): M token rows (in E
    uniform groups unless `dense`), contraction K, output width N; `cached`: the weight cache is on;
    `compiled`: as a compiled model runs it; `graphs`: under CUDA graphs (the module docstring)."""
    kind = "dense" if dense else "grouped"
    host = {r: _host_counted(r, role, cached, graphs) for r in recipes}
    # "host": GPU and host time together; "gpu": GPU time alone
    keys = {r: f"{_device_key(device)}|{kind}|{role}|{r}|M={M}|K={K}|N={N}|E={E}|{rounding}|cache={cached}"
               f"|compiled={compiled}|{'host' if host[r] else 'gpu'}" for r in recipes}
    with _lock:
        known = _load()
        missing = [r for r, key in keys.items() if key not in known]
        if missing:
            new = {keys[r]: _time(r, role, M, K, N, E, dense, rounding, cached, compiled, device, host[r])
                   for r in missing}
            known.update(new)
            _save(new)
        return {r: known[key] for r, key in keys.items()}


def _time(recipe: str, role: str, M: int, K: int, N: int, E: int, dense: bool, rounding: str, cached: bool,
          compiled: bool, device: torch.device, host: bool) -> float:
    from torch.utils._python_dispatch import _disable_current_modes

    spec = GemmSpec(Role(role), Impl(recipe), rounding, reuse_weight=cached and role != Role.WEIGHT_GRAD, dense=dense)
    # the pass runs while a graph is traced: real tensors, no fake or proxy modes, no autograd
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with _disable_current_modes(), torch.no_grad(), on_device:
        args = _operands(role, M, K, N, E, dense, cached, device)
        if spec.role is Role.WEIGHT_GRAD:
            return _bench(lambda: method(spec)(*args, spec, False), host=host)
        x_MC, b, *offs, param = args
        if not (compiled and spec.impl is Impl.FP8_ROWWISE):
            return _bench(lambda: method(spec)(*args[:-1], spec, param, False), host=host)
        # the activation's rows come quantized from their producer, which writes them beside its output
        b_EKN, offs = (b.t()[None], None) if dense else (b, offs[0])
        x_fp8, x_scales = rowwise.quantize_rows(x_MC, rounding, decomposing=False)
        x_fp8 = x_fp8.contiguous()
        x_bytes, scale_bytes = x_fp8.view(torch.uint8), x_scales.view(torch.uint8)
        dgrad = spec.role is Role.INPUT_GRAD

        def gemm():
            return rowwise.quantized_weight_gemm(x_fp8, x_scales, b_EKN, offs, spec, param, dgrad, False)

        def run():
            x_bytes.fill_(0x38)  # 1.0 in float8_e4m3fn: the GEMM's values stay finite
            scale_bytes.fill_(0)
            return gemm()

        return _bench(run, gemm, host)
