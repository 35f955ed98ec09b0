"""Quantized weights reused across GEMMs and microbatches (docs/design.md, "Weight cache").

A weight operand's quantization is reused only where the operand is a view of a parameter's
own storage, and only while no write to that parameter has been seen and no optimizer has
stepped since. The parameter comes from the pass, which knows the graph input each weight
operand is read from, or from the eager op's argument; the operand the op receives is never the
key: under Inductor a transposed weight arrives as a reinterpreted view with a version counter of
its own, and a weight computed in the graph (a cast, a LoRA sum) lives in a buffer Inductor reuses
for other tensors. Such a weight is a different storage from its parameter, so it is never reused.

A write is seen through the parameter's version counter (the one autograd and every in-place
write through it bump) and its storage: the storage itself, held by a weak reference, which
keeps another storage from taking its place at the same address, and its data pointer. FSDP2's
unsharded parameter is refilled from the shard at every all-gather with its version counter
preserved, so there the writes are those to the sharded parameter FSDP2 keeps for it: its and
its local shard's version counters and identities, and the tensors the module's state dicts
handed out (`StateDictAliases`), whose counters no parameter shares.

Entries are held per parameter and dropped with it (a weak reference's callback), at every
optimizer step, and by `clear_weight_cache()`. Writes that bypass the version counter (through
`.data`, collectives, numpy views) are invisible: call `clear_weight_cache()` after them.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._warn import warn


class StateDictAliases:
    """The tensors a module's state dicts handed out for its own parameters, held weakly: they
    share a parameter's storage but not the version counter a reuse is stamped with (a DTensor's
    value and its local shard each have their own, and a write into either reaches the shard below
    the parameter's), so `state()` moves with each write into one of them and with each one freed
    (whose writes can no longer be read)."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []
        self._freed = 0
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type, tuple]:
        # a copy of the module (deepcopy, pickle) hands out aliases of its own parameters
        return StateDictAliases, ()

    def add(self, tensor: torch.Tensor) -> None:
        with self._lock:
            self._refs.append(weakref.ref(tensor, self._on_free))

    def _on_free(self, ref: weakref.ref) -> None:
        self._freed += 1  # without the lock: a collection may free an alias while state() holds it

    def state(self) -> tuple[int, int]:
        """(aliases freed, the sum of the live aliases' versions): versions only grow, so a write
        into a live alias changes the sum, and a freed one changes the count."""
        with self._lock:
            live = [(ref, t) for ref in self._refs if (t := ref()) is not None]
            self._refs = [ref for ref, _ in live]
            return self._freed, sum(t._version for _, t in live)


_ALIASES = "_mxfp8_state_dict_aliases"
_WATCHED = "_mxfp8_state_dict_watched"


def state_dict_aliases(module: torch.nn.Module) -> StateDictAliases:
    """`module`'s record of the tensors its state dicts handed out (made empty on first use)."""
    aliases = module.__dict__.get(_ALIASES)
    if aliases is None:
        aliases = module.__dict__[_ALIASES] = StateDictAliases()
    return aliases


def record_state_dict(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """A `state_dict` post-hook: records the values of `module`'s own parameters, and a DTensor
    value's local shard, in its `StateDictAliases`."""
    aliases = state_dict_aliases(module)
    for name in module._parameters:
        value = state_dict.get(prefix + name)
        if isinstance(value, torch.Tensor):
            aliases.add(value)
            local = getattr(value, "_local_tensor", None)
            if isinstance(local, torch.Tensor):
                aliases.add(local)


def watch_state_dicts(module: torch.nn.Module) -> StateDictAliases:
    """`module`'s `StateDictAliases`, recording the state dicts it hands out from now on."""
    if not module.__dict__.get(_WATCHED):
        module.register_state_dict_post_hook(record_state_dict)
        module.__dict__[_WATCHED] = True
    return state_dict_aliases(module)


class _Entry:
    """A quantization and what it was made under: numbers a write moves, tensors that must still
    be the same objects (held weakly) and storages that must still be the same (held by weak
    references, which keep the storage's address from being reused while held)."""

    __slots__ = ("numbers", "tensors", "storages", "out")

    def __init__(self, seen: tuple, out: tuple[torch.Tensor, ...]) -> None:
        numbers, tensors, storages = seen
        self.numbers = numbers
        self.tensors = tuple(weakref.ref(t) for t in tensors)
        self.storages = tuple(StorageWeakRef(s) for s in storages)
        self.out = out

    def made_under(self, seen: tuple) -> bool:
        numbers, tensors, storages = seen
        return (numbers == self.numbers and all(ref() is t for ref, t in zip(self.tensors, tensors))
                and all(ref.cdata == s._cdata for ref, s in zip(self.storages, storages)))


class _ParamRecord:
    """A parameter's entries, {(offset, shape, strides, kind): _Entry}, behind a weak reference to
    it, and how writes to it are seen: `fsdp`, the FSDPParam whose unsharded parameter it is (held
    weakly), with the `StateDictAliases` of the modules holding its sharded parameter; None for a
    parameter FSDP2 does not manage."""

    __slots__ = ("ref", "fsdp", "aliases", "entries")

    def __init__(self, ref: weakref.ref, fsdp: Any, aliases: tuple[StateDictAliases, ...]) -> None:
        self.ref = ref
        self.fsdp = None if fsdp is None else weakref.ref(fsdp)
        self.aliases = aliases
        self.entries: dict[tuple, _Entry] = {}

    def seen(self, param: torch.Tensor) -> tuple:
        """(numbers, tensors, storages) a write to `param` changes (see `_Entry`)."""
        fsdp_param = None if self.fsdp is None else self.fsdp()
        if fsdp_param is None:  # not FSDP2's, or no longer: its FSDPParam was freed
            return (param._version, param.data_ptr()), (), (param.untyped_storage(),)
        # FSDP2 refills `param` in place at each all-gather, its version preserved and its data
        # moved wherever the storage is resized back to: the writes are the sharded parameter's
        sharded = fsdp_param.sharded_param
        local = sharded._local_tensor
        numbers = (param._version, sharded._version, local._version, *(a.state() for a in self.aliases))
        return numbers, (sharded, local), (param.untyped_storage(), local.untyped_storage())


# per parameter (by id, while its weak reference lives)
_params: dict[int, _ParamRecord] = {}
_lock = threading.Lock()
_hook = None
# the share of a GPU's memory past which the cache warns, once per process: it holds every
# weight's operands until the next optimizer step, with FSDP2 at their unsharded size
WARN_FRACTION = 0.25
_warned = False
_UNKNOWN = object()  # FSDP2 is in use and its internals are not as `_fsdp_param_of` reads them
_warned_unknown = False


def clear_weight_cache() -> None:
    """Drop every reused quantized weight (the next GEMM of each weight quantizes it again)."""
    with _lock:
        dropped = [record.entries for record in _params.values()]
        for record in _params.values():
            record.entries = {}
    # freed outside the lock: an entry may hold the last reference to a parameter (an autograd
    # graph), whose weak reference's callback takes the lock
    del dropped


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    clear_weight_cache()


def cached_bytes() -> int:
    """Bytes the cache holds, over all devices."""
    with _lock:
        return sum(t.numel() * t.element_size() for h in _params.values() for e in h.entries.values() for t in e.out)


def reusable(w: torch.Tensor, param: torch.Tensor | None) -> bool:
    """Whether `w`'s quantization may be reused under `param`: `w` is a view of `param`'s storage
    (the storage itself, not one at the same address) in its dtype, on tensors that have version
    counters."""
    return (param is not None and not w.is_inference() and not param.is_inference() and w.dtype == param.dtype
            and w.device == param.device and w.untyped_storage()._cdata == param.untyped_storage()._cdata)


def _fsdp2_in_use() -> bool:
    """Whether `fully_shard` has sharded a module in this process: it imports
    `torch.distributed.fsdp` and makes each module it shards a subclass of its `FSDPModule`."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return False
    module_class = getattr(fsdp, "FSDPModule", None)
    return module_class is None or bool(module_class.__subclasses__())


def _fsdp_param_of(param: torch.Tensor) -> Any:
    """The FSDPParam whose unsharded parameter `param` is, None for a parameter FSDP2 does not
    manage, `_UNKNOWN` where FSDP2 is in use and its internals are not found. They are private
    and read as torch 2.11 to 2.13 hold them: each sharded module's state in
    `_composable_state._module_state_mapping`, the state's parameter groups, their FSDPParams."""
    if not _fsdp2_in_use():
        return None
    try:
        from torch.distributed._composable_state import _module_state_mapping
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:
        return _UNKNOWN
    try:
        for state_ref in list(_module_state_mapping.values()):
            state = state_ref()
            if not isinstance(state, FSDPState):
                continue
            # torch 2.13 keeps a group per mesh; 2.11 one group, or None
            groups = state.__dict__.get("_fsdp_param_groups") or [state._fsdp_param_group]
            for group in groups:
                for fsdp_param in group.fsdp_params if group is not None else ():
                    if getattr(fsdp_param, "_unsharded_param", None) is param:
                        found = hasattr(fsdp_param.sharded_param, "_local_tensor") and hasattr(
                            fsdp_param._module_info, "module")
                        return fsdp_param if found else _UNKNOWN
    except AttributeError:
        return _UNKNOWN
    return None


def _record(param: torch.Tensor) -> _ParamRecord | None:
    """`param`'s record, made on its first use; None where writes to it cannot be seen."""
    global _warned_unknown
    with _lock:
        record = _params.get(id(param))
        if record is not None and record.ref() is param:
            return record
    fsdp_param = _fsdp_param_of(param)
    if fsdp_param is _UNKNOWN:
        if not _warned_unknown:
            _warned_unknown = True
            warn(f"mxfp8's weight cache does not reuse weights under FSDP2 with torch {torch.__version__}: it "
                 "finds no FSDPParam behind a parameter, whose writes it must see (docs/design.md, 'Weight cache')")
        return None
    aliases = ()
    if fsdp_param is not None:
        info = fsdp_param._module_info
        aliases = tuple(watch_state_dicts(m) for m in (info.module, *getattr(info, "shared_modules", ())))
    pid = id(param)
    with _lock:
        record = _params.get(pid)
        if record is None or record.ref() is not param:
            record = _params[pid] = _ParamRecord(weakref.ref(param, lambda ref: _forget(pid, ref)), fsdp_param, aliases)
    return record


def _forget(pid: int, ref: weakref.ref) -> None:
    with _lock:
        if pid in _params and _params[pid].ref is ref:
            del _params[pid]


def _capturing(w: torch.Tensor) -> bool:
    """Whether `w`'s GEMM is being captured into a CUDA graph: its replays repeat the kernels
    launched now and skip this lookup, so a reuse would be served to every later replay."""
    return w.is_cuda and torch.cuda.is_current_stream_capturing()


def quantized(w: torch.Tensor, param: torch.Tensor | None, kind: tuple,
              quantize: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """`quantize(w)`, reused while `w` is a view of `param` (None: never) and `param` is
    unchanged; `kind` names the quantization (its recipe, rounding, orientation). Never reused
    into a CUDA graph's capture, whose replays then quantize the weight as it is then."""
    if not reusable(w, param) or _capturing(w) or (record := _record(param)) is None:
        return quantize(w)
    global _hook
    key = (w.storage_offset(), tuple(w.shape), w.stride(), kind)
    seen = record.seen(param)
    with _lock:
        if _hook is None:
            _hook = register_optimizer_step_post_hook(_on_optimizer_step)
        entry = record.entries.get(key)
        if entry is not None and entry.made_under(seen):
            return entry.out
    out = quantize(w)
    with _lock:
        record.entries[key] = _Entry(seen, out)
    _warn_if_large(w.device)
    return out


def _capacity(device: torch.device) -> int | None:
    """Bytes of memory on `device`, None where unknown (CPU)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def _warn_if_large(device: torch.device) -> None:
    global _warned
    if _warned or (capacity := _capacity(device)) is None or (cached := cached_bytes()) <= WARN_FRACTION * capacity:
        return
    _warned = True
    warn(f"the mxfp8 weight cache holds {cached / 2**30:.1f} GiB of quantized weights, over "
         f"{WARN_FRACTION:.0%} of {device}'s memory, until the next optimizer step; "
         "weight_cache=False frees it at the cost of quantizing each weight in every GEMM")
