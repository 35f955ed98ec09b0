"""Which recipe runs each GEMM: the options' recipe, or with `recipe="auto"` the fastest of
fp8_rowwise, mxfp8 and bf16 for the GEMM's shape (docs/design.md, "recipe='auto'"): timed on the
GPU itself (`measure.py`, with autotune on, the default), else from a cost model.

The cost model is data: `auto_h200.json`, made by benchmarks/calibrate_auto.py on an H200, holds
each recipe's time over bf16's for every role at calibrated (K, N) shapes and token counts.
A GEMM takes the calibrated shape nearest its own (K, N) in log space, interpolates over the
tokens per group (the rows of a dense GEMM) in log space, and runs in FP8 only where that is
at least `MARGIN` faster than bf16, so measurement noise does not turn into a slower model.
Times are with the weight cache on (a weight's quantization costs once per optimizer step).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import pathlib
from typing import NamedTuple

import torch

from .._warn import warn
from ..eligibility import MULTIPLE_OF
from ..routes import has_fp8_grouped_mm, has_mxfp8_mma
from ..spec import ROLES, Impl
from . import measure

FP8 = ("fp8_rowwise", "mxfp8")
MARGIN = 0.03
_DATA = pathlib.Path(__file__).with_name("auto_h200.json")
CALIBRATED_ON = "H200"  # the GPU _DATA was measured on; every choice's reason names it


class Plan(NamedTuple):
    """What each GEMM (forward, input gradient, weight gradient) runs, and why."""

    impls: tuple[Impl, Impl, Impl]
    reasons: tuple[str, str, str]


_ROW_KEYS = frozenset({"K", "N", "role", "recipe", "tokens", "ratio"})


@functools.cache
def table() -> dict:
    """The calibration: {"grouped"|"dense": [{"K", "N", "role", "recipe", "tokens", "ratio"}]}.

    Raises RuntimeError naming the file if it is missing or malformed, checked once here so that
    a broken install does not surface as a KeyError deep inside a compile."""
    try:
        data = json.loads(_DATA.read_text())
    except (OSError, ValueError) as e:  # missing, unreadable, not JSON
        problem = f"{type(e).__name__}: {e}"
    else:
        problem = _table_problem(data)
    if problem:
        raise RuntimeError(f"recipe='auto' cannot read its calibration {_DATA} ({problem}): reinstall "
                           "mxfp8-inductor or regenerate it with `python benchmarks/calibrate_auto.py`")
    return data


def _table_problem(data: object) -> str | None:
    """What is wrong with a loaded calibration's structure, or None."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    for kind in ("grouped", "dense"):
        rows = data.get(kind)
        if not isinstance(rows, list) or not rows:
            return f"{kind!r} must be a non-empty list of rows"
        for i, row in enumerate(rows):
            missing = _ROW_KEYS - set(row) if isinstance(row, dict) else _ROW_KEYS
            if missing:
                return f"{kind}[{i}] lacks {sorted(missing)}"
            tokens, ratios = row["tokens"], row["ratio"]
            if not (isinstance(tokens, list) and isinstance(ratios, list) and len(tokens) == len(ratios) >= 1):
                return f"{kind}[{i}]: tokens and ratio must be non-empty lists of equal length"
    return None


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear in log(x), constant past the ends."""
    lx = [math.log(v) for v in xs]
    t = math.log(max(x, 1.0))
    if t <= lx[0]:
        return ys[0]
    if t >= lx[-1]:
        return ys[-1]
    i = bisect.bisect_right(lx, t)
    w = (t - lx[i - 1]) / (lx[i] - lx[i - 1])
    return ys[i - 1] * (1 - w) + ys[i] * w


def ratio(kind: str, role: str, recipe: str, K: int, N: int, tokens: float) -> float | None:
    """Calibrated time of `recipe` over bf16's for this GEMM, None where not calibrated."""
    rows = [r for r in table()[kind] if r["role"] == role and r["recipe"] == recipe]
    if not rows:
        return None
    nearest = min(rows, key=lambda r: math.hypot(math.log(r["K"] / K), math.log(r["N"] / N)))
    return _interp(nearest["tokens"], nearest["ratio"], tokens)


def _fits(recipe: str, K: int, N: int) -> bool:
    return recipe == "bf16" or (K % MULTIPLE_OF[recipe] == 0 and N % MULTIPLE_OF[recipe] == 0)


def _measured(M: int, K: int, N: int, E: int, dense: bool, device: torch.device, rounding: str,
              cached: bool, compiled: bool, graphs: bool) -> Plan:
    """Each role's fastest candidate as timed on `device`, FP8 only where at least `MARGIN`
    faster than bf16."""
    tokens = M if dense else M / max(E, 1)
    unit = "rows" if dense else "tokens per group"
    names = [r for r in measure.candidates(device, K, N, None if dense else tokens) if _fits(r, K, N)]
    if names == ["bf16"]:
        return Plan((Impl.BF16,) * 3, (f"bf16: no FP8 recipe multiplies in FP8 on {measure.device_name(device)} "
                                    "at this shape",) * 3)
    where = f"at {tokens:.0f} {unit}, timed on {measure.device_name(device)}" + (" for CUDA graphs" if graphs else "")
    impls, reasons = [], []
    for role in ROLES:
        ms = measure.times(names, role, M, K, N, E, dense=dense, rounding=rounding, cached=cached, compiled=compiled,
                           device=device, graphs=graphs)
        best = min(ms, key=ms.get)
        best = best if ms[best] < (1 - MARGIN) * ms["bf16"] else "bf16"
        shown = ", ".join(f"{r} {t:.3f} ms" for r, t in ms.items())
        impls.append(Impl(best))
        reasons.append(f"{best}: {shown} {where}" if best == "bf16" else
                       f"{best} {ms['bf16'] / ms[best]:.2f}x bf16 ({shown}) {where}")
    return Plan(tuple(impls), tuple(reasons))


def _auto(M: int | None, K: int, N: int, E: int, dense: bool, device: torch.device | None, timed: bool,
          rounding: str, cached: bool, compiled: bool, graphs: bool) -> Plan:
    if M is None:  # left to the op, which picks per call from its shapes (lowering/dispatch.py)
        if timed:
            return Plan((Impl.PER_CALL_TIMED,) * 3,
                        ("token count dynamic at compile time: timed per call's token count",) * 3)
        return Plan((Impl.PER_CALL,) * 3, ("token count dynamic at compile time: chosen per call by its own",) * 3)
    if timed:
        try:
            return _measured(M, K, N, E, dense, device, rounding, cached, compiled, graphs)
        except torch.OutOfMemoryError:
            # the operands of the timing did not fit beside the model: choose without timing
            warn(f"recipe='auto' could not time a GEMM of {M} x {K} x {N} on {measure.device_name(device)}: "
                 f"out of GPU memory; chose from the {CALIBRATED_ON} cost model (autotune=False does so "
                 "without trying)")
    tokens = M if dense else M / max(E, 1)
    impls, reasons = [], []
    for role in ROLES:
        fits = [r for r in FP8 if _fits(r, K, N)]
        costs = {r: c for r in fits if (c := ratio("dense" if dense else "grouped", role, r, K, N, tokens)) is not None}
        best = min(costs, key=costs.get, default=None)
        unit = "rows" if dense else "tokens per group"
        if best is not None and costs[best] < 1 - MARGIN:
            impls.append(Impl(best))
            reasons.append(f"{best} {1 / costs[best]:.2f}x bf16 at {tokens:.0f} {unit} ({CALIBRATED_ON} table)")
        else:
            impls.append(Impl.BF16)
            shown = ", ".join(f"{r} {1 / c:.2f}x" for r, c in costs.items()) or "no FP8 recipe fits"
            reasons.append(f"bf16: {shown} at {tokens:.0f} {unit} ({CALIBRATED_ON} table)")
    return Plan(tuple(impls), tuple(reasons))


def _fixed_recipe(device: torch.device | None) -> str | None:
    """The fixed recipe ("mxfp8" or "bf16") where the H200 table does not apply on this device,
    None where it does (a CUDA GPU of compute capability 9.x, and CPU, which mirrors it so that
    tests see its choices)."""
    if device is None or device.type == "cpu":
        return None
    if has_mxfp8_mma(device):
        return "mxfp8"
    # other GPUs (ROCm among them, whatever capability it reports) are not calibrated
    return None if has_fp8_grouped_mm(device) else "bf16"


def plan_for(recipe: str, wgrad: str, *, M: int | None, K: int, N: int, E: int, dense: bool,
             device: torch.device | None = None, autotune: bool = False, rounding: str = "rceil",
             cached: bool = False, compiled: bool = False, graphs: bool = False) -> Plan:
    """The recipe of each GEMM of one site: `recipe` for all three (the weight gradient in bf16
    with wgrad="bf16"), or with "auto" the choice for M token rows on `device`. With `autotune`
    on a CUDA GPU: each role timed there (`measure.times`, in `rounding`, the weight's quantization
    reused if `cached`; `compiled`: as the compiled graph runs the op, which Inductor decomposes
    and fuses with the activation's producer; `graphs`: under CUDA graphs, which take the host
    time of the calls they replay); M None (dynamic or unknown at compile time) gives
    PER_CALL_TIMED, timed by the op per call's token count. Otherwise the H200 cost model (M None:
    "auto", chosen per call by the op), except that compute capability 10.x takes native MXFP8 (not
    calibrated here) and other GPUs (ROCm ones included) bf16."""
    timed = recipe == "auto" and autotune and measure.measurable(device)
    fixed = _fixed_recipe(device) if recipe == "auto" and not timed else None
    if fixed == "mxfp8" and _fits("mxfp8", K, N):
        plan = Plan((Impl.MXFP8,) * 3, ("compute capability 10.x: native MXFP8 (the cost model is Hopper's)",) * 3)
    elif fixed is not None:
        plan = Plan((Impl.BF16,) * 3, ("no calibrated FP8 GEMM on this GPU",) * 3)
    elif recipe == "auto" and (K == 0 or N == 0):
        # the op returns zeros without a GEMM: no cost to compare, and no FP8 to gain
        plan = Plan((Impl.BF16,) * 3, ("K or N is 0: nothing to multiply",) * 3)
    elif recipe == "auto":
        plan = _auto(M, K, N, E, dense, device, timed, rounding, cached, compiled, graphs)
    else:
        plan = Plan((Impl(recipe),) * 3, (recipe,) * 3)
    if wgrad == "bf16":
        plan = Plan((*plan.impls[:2], Impl.BF16), (*plan.reasons[:2], "wgrad='bf16'"))
    return plan
