"""Expert weights all-gathered by FSDP2 in FP8 (docs/design.md, "FSDP2: FP8 all-gather").

`mxfp8(model, fsdp_fp8_all_gather=True)` makes each marked expert weight an `FP8AllGatherWeight`
parameter. FSDP2 shards it with ordinary tensor ops, which keep the wrapper on the shard, and
before each all-gather asks the shard for its all-gather inputs (`fsdp_pre_all_gather`): the
shard's FP8 data and scales, rounded with the shared weight scales (kernels/shared_weight.py),
about half of bf16's bytes. After the all-gather (`fsdp_post_all_gather`) they are dequantized into
the unsharded parameter, in the parameter dtype FSDP2 computes in. Tiles and matrices lie within
one expert, so a shard along experts quantizes exactly as the whole weight; the GEMM ops' own
rounding of the gathered weight then changes nothing (it is idempotent), and a sharded run
computes as the unsharded one. Between microbatches a rank holds its shard and the shard's FP8
form, quantized once per optimizer step: any write through the parameter (the optimizer's, a
`copy_`, `load_state_dict`) or into a tensor its state dicts handed out (in place, as
torch.distributed.checkpoint's load) drops it. FSDP2 frees the gathered FP8 buffers and the
unsharded parameter as it does bf16's.

Everything else (the optimizer, a compile without FSDP2) sees the wrapped tensor's data through
`__torch_dispatch__`; state dicts hold it as plain tensors over the same data.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from .kernels import shared_weight
from .lowering import weight_cache

aten = torch.ops.aten
# ops that make a tensor standing for the same weight (FSDP2's sharding, copies, state dicts):
# their results stay wrapped, so a shard keeps its all-gather hooks; every other op sees plain data
_KEEP_WRAPPED = {aten.detach.default, aten.alias.default, aten.empty_like.default, aten.new_empty.default,
                 aten.new_zeros.default, aten.slice.Tensor, aten.copy_.default, aten.view.default,
                 aten.as_strided.default, aten._to_copy.default, aten._pin_memory.default, aten.split.Tensor,
                 aten.clone.default}

# writes through any FP8AllGatherWeight so far: a shard's FP8 form is current while none happened
_writes = 0


class FP8AllGatherWeight(torch.Tensor):
    """A parameter's data, all-gathered by FSDP2 as FP8 with the shared weight scales of `recipe`."""

    _tensor: torch.Tensor
    recipe: str
    rounding: str

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, recipe: str, rounding: str) -> FP8AllGatherWeight:
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.size(), strides=tensor.stride(), storage_offset=tensor.storage_offset(), dtype=tensor.dtype,
            layout=tensor.layout, device=tensor.device, requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, recipe: str, rounding: str) -> None:
        self._tensor = tensor
        self.recipe = recipe
        self.rounding = rounding
        # ((writes, dtype, the module's state-dict aliases' state), all-gather inputs)
        self._fp8: tuple[tuple, tuple[torch.Tensor, ...]] | None = None

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        wrappers = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, cls)]
        wrapped = wrappers[0]
        if func._schema.is_mutable:
            # a write through any wrapper (an optimizer step, copy_, load_state_dict) outdates
            # every FP8 form: wrappers made by views share data, and version counters cannot
            # tell, as ops reach the data below the dispatch key that bumps them
            global _writes
            _writes += 1
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._tensor, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _KEEP_WRAPPED:
            return out
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, wrapped.recipe, wrapped.rounding), out)

    def __repr__(self) -> str:
        return f"FP8AllGatherWeight({self._tensor}, recipe={self.recipe!r})"

    def __tensor_flatten__(self) -> tuple[list[str], tuple[str, str]]:
        return ["_tensor"], (self.recipe, self.rounding)

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: tuple[str, str], outer_size: Any,
                             outer_stride: Any) -> FP8AllGatherWeight:
        return FP8AllGatherWeight(inner["_tensor"], *meta)

    def _stable_hash_for_caching(self) -> str:
        """What AOTAutograd's cache keys a parameter of this class on besides its data's metadata."""
        return f"FP8AllGatherWeight({self.recipe},{self.rounding})"

    def fsdp_pre_all_gather(self, mesh: Any, outer_size: torch.Size, outer_stride: tuple[int, ...],
                            module: torch.nn.Module, mp_policy: Any) -> tuple[tuple[torch.Tensor, ...], None]:
        if self.shape[1:] != outer_size[1:] or outer_size[0] % mesh.size():
            raise ValueError(
                f"fsdp_fp8_all_gather quantizes whole experts: this expert weight of shape {tuple(outer_size)} is "
                f"sharded into {tuple(self.shape)} over {mesh.size()} ranks; shard it along experts (dim 0, FSDP2's "
                "default) with a number of experts divisible by the ranks, or mark the model without "
                "fsdp_fp8_all_gather")
        dtype = getattr(mp_policy, "param_dtype", None) or self.dtype
        if mesh.size() == 1:
            # FSDP2 copies a one-rank group's first all-gather input only: send the rounded weight
            return (shared_weight.quantize_dequantize(self._tensor.to(dtype), self.recipe, self.rounding),), None
        # quantized once per update of the shard: every microbatch's gathers reuse it until a
        # write through the parameter (the optimizer's step) or into one of the plain tensors
        # `module`'s state dicts handed out for it (`plain_state_dict`) drops it
        stamp = (_writes, dtype, weight_cache.state_dict_aliases(module).state())
        if self._fp8 is None or self._fp8[0] != stamp:
            self._fp8 = (stamp, shared_weight.quantize(self._tensor.to(dtype), self.recipe, self.rounding))
        return self._fp8[1], None

    def fsdp_post_all_gather(self, outputs: tuple[torch.Tensor, ...], metadata: None, param_dtype: torch.dtype,
                             *, out: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor]] | None:
        if out is None:
            w = outputs[0] if len(outputs) == 1 else dequantize(*outputs, self.recipe, param_dtype)
            return w, (w,)
        # later all-gathers refill the unsharded parameter in place, keeping its version counter
        # as FSDP2 does: the backward's re-gather must not invalidate what the forward saved
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(out):
            if len(outputs) == 1:
                out.copy_(outputs[0])
            else:
                dequantize(*outputs, self.recipe, param_dtype, out=out)
        return None


def dequantize(data: torch.Tensor, scales: torch.Tensor, recipe: str, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """A gathered weight dequantized (`shared_weight.dequantize`): on CUDA, of whole 32-row blocks,
    by MXFP8's dequantize kernel in one pass. Eager only (FSDP2's hooks); the graphs' rounding is
    the pure-torch one, which Inductor decomposes."""
    if data.is_cuda and data.shape[-2] % shared_weight.SHARED_TILE == 0:
        from .kernels import triton_mx  # imported lazily: triton is optional off Linux

        return triton_mx.dequantize(data, shared_weight.column_scales(scales, recipe, data.shape), -2, dtype, out)
    return shared_weight.dequantize(data, scales, recipe, dtype, out)


def plain_state_dict(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """A `state_dict` post-hook: the module's FP8AllGatherWeight values as plain tensors (also
    inside FSDP2's DTensors), so that checkpoints hold values alone and load anywhere, `torch.load`'s
    `weights_only` included; loading into a wrapped parameter copies into it. Writes into these
    tensors reach the shard's data below every `__torch_dispatch__`, so `module` records them
    (`weight_cache.StateDictAliases`) for `fsdp_pre_all_gather` to see."""
    for key, value in state_dict.items():
        if isinstance(value, FP8AllGatherWeight):
            state_dict[key] = value._tensor
        elif isinstance(getattr(value, "_local_tensor", None), FP8AllGatherWeight):
            from torch.distributed.tensor import DTensor

            state_dict[key] = DTensor.from_local(value._local_tensor._tensor, value.device_mesh, value.placements,
                                                 run_check=False, shape=value.shape, stride=value.stride())
    weight_cache.record_state_dict(module, state_dict, prefix, local_metadata)


def wrap(param: torch.nn.Parameter, recipe: str, rounding: str) -> torch.nn.Parameter:
    """`param` as an FP8AllGatherWeight parameter (a new Parameter object)."""
    data = param.data._tensor if isinstance(param.data, FP8AllGatherWeight) else param.data
    return torch.nn.Parameter(FP8AllGatherWeight(data, recipe, rounding), requires_grad=param.requires_grad)


def plain(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """An FP8AllGatherWeight parameter as a plain one over the same data (all-gathered in bf16)."""
    return torch.nn.Parameter(param.data._tensor, requires_grad=param.requires_grad)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Make `model`'s FP8AllGatherWeight parameters plain ones again."""
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if isinstance(p.data, FP8AllGatherWeight):
                setattr(module, name, plain(p))
    return model
