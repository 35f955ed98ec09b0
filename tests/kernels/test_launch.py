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
