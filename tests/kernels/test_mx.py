"""The public quantizers reject what they cannot handle with a ValueError naming the requirement."""

import pytest
import torch
from helpers import make_offs

import mxfp8_inductor as mx

X = torch.randn(64, 64, dtype=torch.bfloat16)
DATA, SCALES = mx.quantize(X, -1)
OFFS = make_offs([20, 0, 44])
GDATA, GSCALES = mx.quantize_groups(X, OFFS)

CASES = [
    (lambda: mx.quantize(X, dim=5), "out of range"),
    (lambda: mx.quantize(torch.tensor(1.0), dim=0), "0-d"),
    (lambda: mx.quantize(X.half()), "bf16 or fp32"),
    (lambda: mx.quantize(X[:, :40]), "multiple of 32"),
    (lambda: mx.quantize([1.0] * 32), "must be a tensor"),
    (lambda: mx.quantize(X, rounding="nearest"), "rounding"),
    (lambda: mx.dequantize(X, SCALES), "float8_e4m3fn"),
    (lambda: mx.dequantize(DATA, SCALES.view(torch.uint8)), "float8_e8m0fnu"),
    (lambda: mx.dequantize(DATA, SCALES[:3]), "do not fit"),
    (lambda: mx.dequantize(DATA, SCALES, dtype=torch.float16), "bf16 or fp32"),
    (lambda: mx.quantize_groups(X, make_offs([30, 20]).flip(0)), "non-decreasing"),
    (lambda: mx.quantize_groups(X, torch.tensor([30, 101], dtype=torch.int32)), "past the 64 rows"),
    (lambda: mx.quantize_groups(X, torch.tensor([-5, 64], dtype=torch.int32)), "non-decreasing"),
    (lambda: mx.quantize_groups(X, [20, 64]), "1-D int32 tensor"),
    (lambda: mx.quantize_groups(X, OFFS.long()), "int32"),
    (lambda: mx.quantize_groups(X, OFFS[:0]), "at least one"),
    (lambda: mx.quantize_groups(X[0], OFFS), "2-D"),
    (lambda: mx.dequantize_groups(GDATA, GSCALES, torch.tensor([70], dtype=torch.int32)), "past the 64 rows"),
    (lambda: mx.to_blocked(SCALES.float()), "float8_e8m0fnu"),
    (lambda: mx.to_blocked(SCALES[0]), "2-D or 3-D"),
    (lambda: mx.to_blocked_groups(SCALES, make_offs([40, 30])), "past the 64 rows"),
    (lambda: mx.to_blocked_groups(SCALES, OFFS, along="diagonal"), "along"),
]


@pytest.mark.parametrize("call, match", CASES, ids=[m for _, m in CASES])
def test_public_functions_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_valid_calls_still_work():
    assert torch.equal(mx.dequantize(DATA, SCALES, -1), mx.dequantize(DATA, SCALES, dim=1))
    blocked, starts = mx.to_blocked_groups(SCALES, OFFS)
    assert starts.tolist() == [0, 128, 128, 256]
    assert mx.to_blocked(SCALES).shape == (128, 4)
