"""Quantized weights kept across the microbatches of an optimizer step (docs/design.md, "Weight
cache").

Weights do not change between the forward and backward passes of the microbatches that one
optimizer step accumulates, so their FP8 operands are computed once and reused. An entry is
served only while its weight has the same storage, data pointer, layout and version counter as
when it was made, and no optimizer has stepped since: every in-place write through autograd's
view of a tensor (optimizer updates, `copy_`, `load_state_dict`) bumps the version counter, and
an optimizer step clears the whole cache, which also covers FSDP2, whose all-gathers refill the
unsharded parameters with their version counter preserved. Writes through `.data` bypass the
version counter, as they do for autograd: call `clear_weight_cache()` after them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook

_entries: dict[tuple, tuple[StorageWeakRef, int, int, tuple[torch.Tensor, ...]]] = {}
_hook = None
# the share of a GPU's memory past which the cache warns, once per process: it holds every
# weight's operands until the next optimizer step, with FSDP2 at their unsharded size
WARN_FRACTION = 0.25
_warned = False


def clear_weight_cache() -> None:
    """Drop every cached quantized weight (the next GEMM of each weight quantizes it again)."""
    _entries.clear()


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    _entries.clear()


def cached_bytes() -> int:
    """Device bytes the cache holds."""
    return sum(t.numel() * t.element_size() for *_, tensors in _entries.values() for t in tensors)


def quantized(w: torch.Tensor, kind: tuple, quantize: Callable[[torch.Tensor], tuple[torch.Tensor, ...]],
              cache: bool) -> tuple[torch.Tensor, ...]:
    """`quantize(w)`, served from the cache while `w` is unchanged when `cache`; `kind` names
    the quantization (its recipe, rounding, orientation)."""
    if not cache or w.is_inference():  # inference tensors have no version counter
        return quantize(w)
    global _hook
    if _hook is None:
        _hook = register_optimizer_step_post_hook(_on_optimizer_step)
    storage = w.untyped_storage()
    # the storage's address, which an entry's weak reference keeps from being reused; the weak
    # reference itself is made on a miss only, as every GEMM of every step looks up its weight
    key = (storage._cdata, w.storage_offset(), tuple(w.shape), w.stride(), w.dtype, w.device, kind)
    entry = _entries.get(key)
    if entry is not None and not entry[0].expired() and entry[1] == w.data_ptr() and entry[2] == w._version:
        return entry[3]
    for stale in [k for k, e in _entries.items() if e[0].expired()]:  # weights freed since
        del _entries[stale]
    out = quantize(w)
    _entries[key] = (StorageWeakRef(storage), w.data_ptr(), w._version, out)
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
    warnings.warn(f"the mxfp8 weight cache holds {held / 2**30:.1f} GiB of quantized weights, over "
                  f"{WARN_FRACTION:.0%} of {device}'s memory, until the next optimizer step; "
                  "weight_cache=False frees it at the cost of quantizing each weight in every GEMM",
                  stacklevel=2)
