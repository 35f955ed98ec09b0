"""`kernels/launch.py`'s bound launches take each call's own tensors, those a host TMA descriptor
argument is over included (the Gluon GEMM's operands): Triton's interpreter on CPU, the kernel
itself on a GPU."""

import pytest
import torch
import triton
import triton.language as tl

from mxfp8_inductor.kernels import launch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 16


@triton.jit
def _copy_kernel(x_desc, y_ptr, B: tl.constexpr):
    i = tl.program_id(0)
    tl.store(y_ptr + i * B + tl.arange(0, B), x_desc.load([i * B]))


def _copy(x: torch.Tensor, y: torch.Tensor) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    n = x.numel()
    launch.launch_keyed(("test_launch", n), (x, y), lambda: (
        _copy_kernel, (n // BLOCK,), (TensorDescriptor(x, [n], [1], [BLOCK]), y), {"B": BLOCK}))


def test_a_descriptor_argument_is_moved_onto_each_calls_tensor():
    pytest.importorskip("triton.tools.tensor_descriptor")
    if DEVICE == "cuda":
        from mxfp8_inductor.kernels.triton_fp8_gemm import _ensure_allocator

        _ensure_allocator()
    bound = len(launch._bound)
    for call in range(3):
        x = torch.arange(64, dtype=torch.float32, device=DEVICE) + 100 * call
        y = torch.zeros(64, device=DEVICE)
        _copy(x, y)
        assert torch.equal(y, x), f"call {call} read another call's tensor"
    assert len(launch._bound) == bound + 1  # one binding, taken by the later calls


@pytest.mark.skipif(DEVICE != "cuda", reason="the launcher's hooks run on a GPU only")
def test_a_registered_launch_hook_sees_every_bound_launch():
    """The bound launch skips building launch metadata only while Triton has no hook to give it
    to: a profiler's hook, once added, is called on every launch, with the kernel's name."""
    from triton import knobs

    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    x, y = torch.arange(64, dtype=torch.float32, device=DEVICE), torch.zeros(64, device=DEVICE)
    _copy(x, y)  # bound before the hook: the hook must still see the later launches
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        for _ in range(2):
            _copy(x, y)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    _copy(x, y)
    assert seen == ["_copy_kernel"] * 2
    assert torch.equal(y, x)


@pytest.mark.parametrize("hook, hooked", [(None, False), ("empty chain", False), ("chain", True), (print, True)])
def test_a_launch_hook_counts_where_it_would_call_something(hook, hooked):
    from triton import knobs

    if isinstance(hook, str):
        chain = knobs.HookChain()
        if hook == "chain":
            chain.add(print)
        hook = chain
    assert launch._hooked(hook) is hooked
