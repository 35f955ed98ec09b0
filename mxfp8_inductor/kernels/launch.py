"""Launch a @triton.jit kernel on a CUDA GPU without Triton's per-call argument binding.

`kernel[grid](...)` binds and specializes every argument and builds a cache key on each call. A
compiled MoE block calls our quantizers a dozen times per step, and at small MoE shapes their host
time exceeds their GPU time (benchmarks/bench_launch.py times the routes). Here the compiled
kernel Triton returns on the first call is kept under a key finer than Triton's specialization
(every int by value, every tensor by dtype, device and pointer alignment), and later calls hand it
straight to its launcher, as Inductor launches its own kernels. Off CUDA (the interpreter) this is `kernel[grid](...)`.

`launch_keyed` goes one step further for callers that launch one kernel with the same arguments
but new tensors every step: under the caller's key it keeps the launch with everything but the
tensors fixed (`bind`), so the caller's own argument computation and the key above are paid once
per shape, not per call. A host TMA descriptor over one of those tensors (a Gluon kernel's
argument) is rebuilt over the new tensor without its constructor's checks, which the key makes
hold: they read only the tensor's dtype and alignment and what the key fixes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from triton import knobs

_MAX_ENTRIES = 4096  # a bound for callers whose shapes never repeat; a cleared cache only costs time
_compiled: dict[tuple, tuple] = {}


def _grid3(grid, kwargs) -> tuple[int, int, int]:
    grid = grid(kwargs) if callable(grid) else grid
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def _hooked(hook) -> bool:
    """Whether a launch hook of Triton's knobs would call anything: None, or a chain of none
    (`knobs.HookChain`, what the knob holds unless a profiler adds to it), would not."""
    return hook is not None and getattr(hook, "calls", True) != []


def _run(compiled, grid: tuple[int, int, int], device: int, full) -> None:
    stream = torch._C._cuda_getCurrentRawStream(device)  # as Inductor's launchers get it
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _hooked(enter) or _hooked(leave):
        meta = compiled.launch_metadata(grid, stream, *full)
    else:  # Triton's launcher then calls neither hook: none of their launch metadata to build
        meta = enter = leave = None
    compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)


def _first_launch(kernel, grid, args, kwargs):
    """`kernel[grid](*args, **kwargs)` -> the compiled kernel and the names of the parameters its
    launcher takes after `args`, constexprs included, in signature order."""
    return kernel[grid](*args, **kwargs), kernel.arg_names[len(args):]


def _launch_cached(kernel, grid, args, kwargs):
    """Launch on a CUDA device; returns the compiled kernel and its full argument tuple."""
    device = args[0].device.index  # the launch device, which the key and the stream follow
    # tensors by dtype and 16-byte pointer alignment (Triton's specialization, and finer), all else
    # by value (ints: finer than Triton's ==1, %16 and i32/i64 classes); built inline: a function
    # call per argument would double the key's cost
    key = (kernel, device, *kwargs.items(),
           *[(a.dtype, a.data_ptr() % 16) if isinstance(a, torch.Tensor) else a for a in args])
    entry = _compiled.get(key)
    if entry is None:
        if len(_compiled) >= _MAX_ENTRIES:
            _compiled.clear()
        entry = _compiled[key] = _first_launch(kernel, grid, args, kwargs)
        return entry[0], (*args, *(kwargs[name] for name in entry[1]))
    compiled, tail = entry
    full = (*args, *(kwargs[name] for name in tail))
    _run(compiled, _grid3(grid, kwargs), device, full)
    return compiled, full


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`: `args` are the kernel's leading parameters (args[0] a tensor
    on the launch device), `kwargs` its remaining ones by name and launch options (num_warps, ...);
    a callable `grid` is called with `kwargs`."""
    if args[0].is_cuda:
        _launch_cached(kernel, grid, args, kwargs)
    else:
        kernel[_grid3(grid, kwargs)](*args, **kwargs)


def _slot(a, tensors: tuple) -> int | None:
    """The index in `tensors` of the object `a` is, or of the tensor a host TMA descriptor `a`
    is over (its `base`); None for any other argument."""
    base = a if isinstance(a, torch.Tensor) else getattr(a, "base", None)
    if not isinstance(base, torch.Tensor):
        return None
    return next((j for j, t in enumerate(tensors) if t is base), None)


def _over(a, t: torch.Tensor | None):
    """Argument `a` for tensor `t`: t itself, or a copy of descriptor `a` over t."""
    if isinstance(a, torch.Tensor):
        return t
    # neither the constructor (its checks hold: module doc) nor copy.copy (its reduce protocol):
    # each costs several times this, per descriptor and launch
    moved = object.__new__(type(a))
    moved.__dict__.update(a.__dict__)
    moved.base = t
    return moved


def bind(kernel, grid: tuple[int, ...], args: tuple, kwargs: dict, tensors: tuple) -> Callable[..., None]:
    """`launch(kernel, grid, *args, **kwargs)` (tensors[0] on the launch device), returning
    `relaunch(*new)`: the same launch with new[j] wherever `args` holds tensors[j] (the same
    object; None entries are skipped), and host TMA descriptors over tensors[j] moved onto new[j].
    The caller keys `relaunch` on all it fixes: every other argument, each descriptor's shape,
    strides, block and layout, and the new tensors' dtypes and 16-byte alignment, which the
    compiled kernel is specialized on."""
    slots = [_slot(a, tensors) for a in args]
    grid3 = _grid3(grid, kwargs)
    # the bound launch keeps no tensor the caller passes per call alive
    base = [a if j is None else None for a, j in zip(args, slots)]
    # (argument index, tensor index, the descriptor without its tensor or None for a tensor)
    moved = [(i, j, None if isinstance(a, torch.Tensor) else _over(a, None))
             for i, (a, j) in enumerate(zip(args, slots)) if j is not None]

    def bound_args(new) -> list:
        full = base.copy()
        for i, j, template in moved:
            full[i] = new[j] if template is None else _over(template, new[j])
        return full

    if not tensors[0].is_cuda:
        kernel[grid3](*args, **kwargs)

        def relaunch(*new) -> None:
            kernel[grid3](*bound_args(new), **kwargs)

        return relaunch
    device = tensors[0].device.index
    compiled, tail = _first_launch(kernel, grid, args, kwargs)
    base += [kwargs[name] for name in tail]

    def relaunch(*new) -> None:
        _run(compiled, grid3, device, bound_args(new))

    return relaunch


_bound: dict[tuple, Callable[..., None]] = {}


def launch_keyed(key: tuple, tensors: tuple, prepare: Callable[[], tuple]) -> Callable[..., None]:
    """Launch the kernel bound under `key` with `tensors` (tensors[0] on the launch device; None
    entries allowed); on a miss `prepare()` returns (kernel, grid, args, kwargs) for `launch`, with
    the objects of `tensors` among args, and the launch is made and bound (`bind`). `key` must fix
    every non-tensor input of `prepare`; each tensor's dtype, size and 16-byte alignment (what the
    compiled kernel is specialized on) are added here. Returns the bound launch, for callers
    that key it themselves on less."""
    key = (key, tensors[0].device,
           *[(t.dtype, t.numel(), t.data_ptr() % 16) if t is not None else None for t in tensors])
    relaunch = _bound.get(key)
    if relaunch is None:
        if len(_bound) >= _MAX_ENTRIES:
            _bound.clear()
        kernel, grid, args, kwargs = prepare()
        relaunch = _bound[key] = bind(kernel, grid, args, kwargs, tensors)
    else:
        relaunch(*tensors)
    return relaunch


_picked: dict[tuple, dict] = {}


def launch_tuned(kernel, tuned, key: tuple, grid, args: tuple, consts: dict, interpreter_config: dict) -> None:
    """Run `kernel` (args[0] a tensor on the launch device). On GPU, the autotuner `tuned` (made
    from `kernel`) picks the config for `key` once, and later calls take the launch bound with it
    (`launch_keyed`): the autotuner's own per-call dispatch costs more host time than the GEMMs of
    small MoE layers take on the GPU. The interpreter runs `interpreter_config`."""
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    if not args[0].is_cuda:
        config = interpreter_config
    elif (picked := _picked.get((tuned, key))) is None:
        tuned[grid](*args, **consts)
        _picked[(tuned, key)] = tuned.best_config.all_kwargs()
        return
    else:
        config = picked
    # every other launch argument follows from the non-tensor args, the consts and the config
    bound_key = (kernel, *[a for a in args if not isinstance(a, torch.Tensor)], *consts.items(), *config.items())
    launch_keyed(bound_key, tensors, lambda: (kernel, grid, args, {**consts, **config}))
