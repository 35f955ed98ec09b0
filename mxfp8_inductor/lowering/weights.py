"""Quantized weights reused across GEMMs and microbatches (docs/design.md, "Weight cache").

A weight operand's quantization is reused only where the operand is a view of a parameter's
own storage, and only while that parameter's version counter (the one autograd and every
in-place write through it bump) and data pointer are unchanged and no optimizer has stepped
since. The parameter comes from the pass, which knows the graph input each weight operand is
read from, or from the eager op's argument; the operand the op receives is never the key: under
Inductor a transposed weight arrives as a reinterpreted view with a version counter of its own,
and a weight computed in the graph (a cast, a LoRA sum) lives in a buffer Inductor reuses for
other tensors. Such a weight is a different storage from its parameter, so it is never reused.

Entries are held per parameter and dropped with it (a weak reference's callback), at every
optimizer step (which also covers FSDP2, whose all-gathers refill the unsharded parameter with
its version counter preserved), and by `clear_weight_cache()`. Writes that bypass the version
counter (through `.data`, collectives, numpy views) are invisible: call `clear_weight_cache()`
after them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._warn import warn

# per parameter (by id, while its weak reference lives): the weak reference and its entries,
# {(offset, shape, strides, kind): (version, data pointer, quantized tensors)}
_params: dict[int, tuple[weakref.ref, dict[tuple, tuple[int, int, tuple[torch.Tensor, ...]]]]] = {}
_lock = threading.Lock()
_hook = None
# the share of a GPU's memory past which the cache warns, once per process: it holds every
# weight's operands until the next optimizer step, with FSDP2 at their unsharded size
WARN_FRACTION = 0.25
_warned = False


def clear_weight_cache() -> None:
    """Drop every reused quantized weight (the next GEMM of each weight quantizes it again)."""
    global _params
    with _lock:
        held, _params = _params, {}
    # freed outside the lock: an entry may hold the last reference to a parameter (an autograd
    # graph), whose weak reference's callback takes the lock
    del held


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    clear_weight_cache()


def cached_bytes() -> int:
    """Bytes the cache holds, over all devices."""
    with _lock:
        return sum(t.numel() * t.element_size() for _, entries in _params.values()
                   for *_, tensors in entries.values() for t in tensors)


def reusable(w: torch.Tensor, param: torch.Tensor | None) -> bool:
    """Whether `w`'s quantization may be reused under `param`'s version counter: `w` is a view
    of `param`'s storage in its dtype, on tensors that have version counters."""
    return (param is not None and not w.is_inference() and not param.is_inference() and w.dtype == param.dtype
            and w.device == param.device
            and w.untyped_storage().data_ptr() == param.untyped_storage().data_ptr())


def _forget(pid: int, ref: weakref.ref) -> None:
    with _lock:
        if pid in _params and _params[pid][0] is ref:
            del _params[pid]


def quantized(w: torch.Tensor, param: torch.Tensor | None, kind: tuple,
              quantize: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """`quantize(w)`, reused while `w` is a view of `param` (None: never) and `param` is
    unchanged; `kind` names the quantization (its recipe, rounding, orientation)."""
    if not reusable(w, param):
        return quantize(w)
    global _hook
    key = (w.storage_offset(), tuple(w.shape), w.stride(), kind)
    stamp = (param._version, param.data_ptr())
    with _lock:
        if _hook is None:
            _hook = register_optimizer_step_post_hook(_on_optimizer_step)
        held = _params.get(id(param))
        if held is not None and held[0]() is param:
            entry = held[1].get(key)
            if entry is not None and entry[:2] == stamp:
                return entry[2]
    out = quantize(w)
    with _lock:
        held = _params.get(id(param))
        if held is None or held[0]() is not param:
            pid = id(param)
            held = _params[pid] = (weakref.ref(param, lambda ref: _forget(pid, ref)), {})
        held[1][key] = (*stamp, out)
    _warn_if_large(w.device)
    return out


def _capacity(device: torch.device) -> int | None:
    """Bytes of memory on `device`, None where unknown (CPU)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def _warn_if_large(device: torch.device) -> None:
    global _warned
    if _warned or (capacity := _capacity(device)) is None or (held := cached_bytes()) <= WARN_FRACTION * capacity:
        return
    _warned = True
    warn(f"the mxfp8 weight cache holds {held / 2**30:.1f} GiB of quantized weights, over "
         f"{WARN_FRACTION:.0%} of {device}'s memory, until the next optimizer step; "
         "weight_cache=False frees it at the cost of quantizing each weight in every GEMM")
