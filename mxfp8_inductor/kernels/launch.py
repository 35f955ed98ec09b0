"""Launch a @triton.jit kernel on a CUDA GPU without Triton's per-call argument binding.

`kernel[grid](...)` binds and specializes every argument and builds a cache key on each call. A
compiled MoE block calls our quantizers 16 times per step, and at small MoE shapes their host time
exceeds their GPU time; skipping that work saves 2-11 us of the 52-57 us a quantizer op call takes
on the H200 machine (benchmarks/bench_launch.py). Here the compiled kernel Triton returns on the
first call is kept under a key finer than Triton's specialization (every int by value, every
tensor by dtype, device and pointer alignment), and later calls hand it straight to its launcher,
as Inductor launches its own kernels. Off CUDA (the interpreter) this is `kernel[grid](...)`.
"""

from __future__ import annotations

import torch
from triton import knobs

_MAX_ENTRIES = 4096  # a bound for callers whose shapes never repeat; a cleared cache only costs time
_compiled: dict[tuple, tuple] = {}


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`: `args` are the kernel's leading parameters (args[0] a tensor
    on the launch device), `kwargs` its remaining ones by name and launch options (num_warps, ...);
    a callable `grid` is called with `kwargs`."""
    if callable(grid):
        grid = grid(kwargs)
    if not args[0].is_cuda:
        kernel[grid](*args, **kwargs)
        return
    device = args[0].device.index  # the launch device, which the key and the stream follow
    # tensors by dtype and 16-byte pointer alignment (Triton's specialization, and finer), all else
    # by value (ints: finer than Triton's ==1, %16 and i32/i64 classes); built inline, not by a
    # function per argument: 5-6 instead of 10-11 us per call on the CPU machine
    key = (kernel, device, *kwargs.items(),
           *[(a.dtype, a.data_ptr() % 16) if isinstance(a, torch.Tensor) else a for a in args])
    entry = _compiled.get(key)
    if entry is None:
        if len(_compiled) >= _MAX_ENTRIES:
            _compiled.clear()
        compiled = kernel[grid](*args, **kwargs)
        # its launcher takes every parameter in signature order, constexprs included
        _compiled[key] = (compiled, kernel.arg_names[len(args):])
        return
    compiled, tail = entry
    full = (*args, *(kwargs[name] for name in tail))
    stream = torch._C._cuda_getCurrentRawStream(device)  # as Inductor's launchers get it
    enter = knobs.runtime.launch_enter_hook
    meta = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, meta, enter, knobs.runtime.launch_exit_hook, *full)
