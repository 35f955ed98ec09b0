"""Shared test helpers: bitwise comparison, SQNR, group offsets."""

import torch

from mxfp8_inductor.check import sqnr  # noqa: F401  (re-exported for the tests)


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bit patterns, except that any NaN matches any NaN (payloads are not part of the contract)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if actual.element_size() == 1:
        a, e = actual.view(torch.uint8), expected.view(torch.uint8)
        if actual.dtype == torch.float8_e4m3fn:
            nan_a, nan_e = (a & 0x7F) == 0x7F, (e & 0x7F) == 0x7F
        else:
            nan_a, nan_e = a == 255, e == 255
    else:
        ibits = {2: torch.int16, 4: torch.int32}[actual.element_size()]
        a, e = actual.view(ibits), expected.view(ibits)
        nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    same = (a == e) | (nan_a & nan_e)
    bad = (~same).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} of {a.numel()} elements differ, first at {bad[:5].tolist()}"


def make_offs(sizes: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32, device=device).cumsum(0).to(torch.int32)
