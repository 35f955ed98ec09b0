"""The FP8 byte transpose (`kernels/triton_transpose.py`) against torch's `.contiguous()`, bit for
bit, on every byte value: tiles cut at the edges, one expert and many, 2-D; what it does not
take goes to torch unchanged. Triton's interpreter on CPU, the kernel itself on a GPU."""

import pytest
import torch
from helpers import assert_bitwise_equal

from mxfp8_inductor.kernels import triton_transpose

F8 = torch.float8_e4m3fn
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _bytes(*shape: int, seed: int = 0) -> torch.Tensor:
    """Every byte value, NaN patterns included, as float8."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(F8).to(DEVICE)


@pytest.mark.parametrize("E,C,R", [(3, 40, 72), (1, 16, 32), (2, 130, 33), (5, 1, 200), (1, 257, 1)])
def test_a_transposed_view_comes_out_as_torch_copies_it(E, C, R):
    w_ECR = _bytes(E, C, R, seed=E * C + R)
    view_ERC = w_ECR.transpose(-2, -1)
    got = triton_transpose.contiguous(view_ERC)
    assert got.is_contiguous() and got.shape == (E, R, C)
    assert_bitwise_equal(got, view_ERC.contiguous())


def test_two_dims_and_uint8():
    w_CR = _bytes(48, 100).view(torch.uint8)
    got = triton_transpose.contiguous(w_CR.t())
    assert got.dtype == torch.uint8 and got.shape == (100, 48)
    assert torch.equal(got, w_CR.t().contiguous())


def test_a_slice_starts_at_its_own_offset():
    """A view whose storage starts past the base's (one expert of many) is read from its start."""
    w_ECR = _bytes(4, 64, 96)
    view = w_ECR[2:].transpose(-2, -1)
    assert_bitwise_equal(triton_transpose.contiguous(view), view.contiguous())


@pytest.mark.parametrize("make", [
    lambda: _bytes(2, 32, 64),                                     # contiguous already
    lambda: _bytes(2, 32, 64)[:, :, ::2].transpose(-2, -1),        # strided: no contiguous base
    lambda: _bytes(2, 64, 32).permute(2, 0, 1),                    # not a transpose of the last two
    lambda: torch.randn(32, 64, device=DEVICE).t(),                # 4-byte elements
    lambda: _bytes(0, 16, 32).transpose(-2, -1),                   # empty
], ids=["contiguous", "strided", "permuted", "float32", "empty"])
def test_what_it_does_not_take_goes_to_torch(make, monkeypatch):
    x = make()
    monkeypatch.setattr(triton_transpose, "launch_tuned", lambda *a: pytest.fail("kernel launched"))
    got = triton_transpose.contiguous(x)
    assert got.is_contiguous()
    assert torch.equal(got.view(torch.uint8) if got.element_size() == 1 else got,
                       x.contiguous().view(torch.uint8) if x.element_size() == 1 else x.contiguous())
