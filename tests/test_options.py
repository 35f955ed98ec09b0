"""Option and argument validation: what MXFP8Config and the ops accept, and what their errors name."""

import pytest
import torch

import mxfp8_inductor as mx
from mxfp8_inductor.options import MXFP8Config


def test_weight_cache_is_opt_in():
    assert MXFP8Config().weight_cache is False
    assert MXFP8Config(weight_cache=True).weight_cache is True


@pytest.mark.parametrize("field", ["weight_cache", "autotune", "mxfp8_fused", "fsdp_fp8_all_gather"])
@pytest.mark.parametrize("value", [None, 0, 1, "yes", 1.0])
def test_switches_take_only_a_bool(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be True or False, got {value!r}"):
        MXFP8Config(**{field: value})


@pytest.mark.parametrize("value", [True, False, -1, 2048.0, "2048"])
def test_dense_min_dim_takes_only_a_non_negative_int(value):
    with pytest.raises(ValueError, match=rf"dense_min_dim must be a non-negative int, got {value!r}"):
        MXFP8Config(dense_min_dim=value)
    assert MXFP8Config(dense_min_dim=0).dense_min_dim == 0


def test_linear_bias_dtype_error_names_the_bias_dtype():
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"bias must have the weight's dtype torch\.bfloat16, got torch\.float32"):
        mx.linear(x, w, torch.zeros(32), recipe="fp8_rowwise")
    with pytest.raises(ValueError, match=r"x and weight must share a dtype, got torch\.float32 and torch\.bfloat16"):
        mx.linear(x.float(), w, recipe="fp8_rowwise")
