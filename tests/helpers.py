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


def pow2_scales(n: int, generator: torch.Generator, run: int = 1, lo: int = -10, hi: int = 10) -> torch.Tensor:
    """n powers of two, equal within runs of `run` consecutive entries (run=32: one per MXFP8
    block), their exponents spread evenly over lo..hi, both ends included, in random order: the
    full range whatever the seed. Powers of two keep bf16 products exact, so only the quantizers
    see the spread."""
    runs = -(-n // run)
    exps = torch.linspace(lo, hi, runs).round()[torch.randperm(runs, generator=generator)]
    return (2.0**exps).repeat_interleave(run)[:n]


def equalize_columns(ref: torch.Tensor, got: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ref and got (2-D) with each column divided by ref's column norm, so that SQNR weighs every
    column alike: an error confined to columns of small magnitude is no longer lost in the total."""
    scale = ref.double().norm(dim=0, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return ref.double() / scale, got.double() / scale


def assert_sqnr_near(ref: torch.Tensor, got: torch.Tensor, expected_db: float, tol_db: float, what: str = "") -> None:
    """SQNR(ref, got) within tol_db of the recipe's expected value. The lower side catches lost
    accuracy; the upper side a GEMM left unquantized (inf dB) or quantized another way."""
    db = sqnr(ref, got)
    assert abs(db - expected_db) <= tol_db, f"{what}: SQNR {db:.2f} dB, expected {expected_db} +- {tol_db} dB"


def spread(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """Gaussian bf16 data with every row and every column (the last two dims) scaled by a random
    power of two in 2^-10..2^10: values far below their block's max fall into e4m3 subnormals,
    so that where the blocks lie changes the numbers."""
    x = torch.randn(*shape, generator=gen)
    row_exp = torch.randint(-10, 11, (*shape[:-1], 1), generator=gen)
    col_exp = torch.randint(-10, 11, (*shape[:-2], 1, shape[-1]), generator=gen)
    return (x * torch.exp2(row_exp.float()) * torch.exp2(col_exp.float())).bfloat16()
