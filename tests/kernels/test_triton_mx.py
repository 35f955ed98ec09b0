"""Triton kernels (interpreter on CPU) are bit-exact with the pure-torch reference."""

import pytest
import torch
from helpers import assert_bitwise_equal, make_offs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxfp8_inductor.kernels import launch
from mxfp8_inductor.kernels import reference as ref
from mxfp8_inductor.kernels import triton_mx as tri

pytestmark = pytest.mark.interpreter
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
ROUNDING = st.sampled_from(["rceil", "floor"])
DTYPE = st.sampled_from([torch.bfloat16, torch.float32])


def _values(shape, seed: int, dtype, specials: bool) -> torch.Tensor:
    """Random values spanning many binades, optionally with zero / subnormal / NaN / inf entries."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-40, 40, shape, generator=g).float())
    if specials:
        flat = x.view(-1)
        n = flat.numel()
        picks = torch.randint(0, n, (6,), generator=g)
        flat[picks[0]] = float("nan")
        flat[picks[1]] = float("inf")
        flat[picks[2]] = -float("inf")
        flat[picks[3]] = 2.0**-130
        flat[picks[4] : picks[4] + 40] = 0.0
        flat[picks[5] : picks[5] + 32] = 2.0**-133
    return x.to(dtype)


@st.composite
def groups(draw, max_groups=6):
    sizes = draw(st.lists(st.sampled_from([0, 1, 5, 31, 32, 33, 64, 70]), min_size=1, max_size=max_groups))
    tail = draw(st.sampled_from([0, 3]))
    return sizes, sum(sizes) + tail


@SETTINGS
@given(
    rows=st.integers(1, 70),
    nblk=st.integers(1, 4),
    dim=st.sampled_from([0, 1]),
    rounding=ROUNDING,
    dtype=DTYPE,
    specials=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_quantize_2d(rows, nblk, dim, rounding, dtype, specials, seed):
    shape = (rows, 32 * nblk) if dim == 1 else (32 * nblk, rows)
    x = _values(shape, seed, dtype, specials)
    d_ref, s_ref = ref.quantize(x, dim, rounding)
    d_tri, s_tri = tri.quantize(x, dim, rounding)
    assert_bitwise_equal(d_tri, d_ref)
    assert_bitwise_equal(s_tri, s_ref)
    assert_bitwise_equal(tri.dequantize(d_ref, s_ref, dim, dtype), ref.dequantize(d_ref, s_ref, dim, dtype))
    assert_bitwise_equal(tri.quantize_dequantize(x, dim, rounding), ref.quantize_dequantize(x, dim, rounding))


@SETTINGS
@given(
    E=st.integers(1, 3),
    nblk=st.integers(1, 2),
    other=st.sampled_from([32, 40]),
    dim=st.sampled_from([1, 2]),
    transposed=st.booleans(),
    rounding=ROUNDING,
    seed=st.integers(0, 2**16),
)
def test_quantize_3d_weights(E, nblk, other, dim, transposed, rounding, seed):
    """Weights [E, K, N] along K or N, from a contiguous tensor or a transposed view of [E, N, K]."""
    K, N = (32 * nblk, other) if dim == 1 else (other, 32 * nblk)
    w = _values((E, N, K), seed, torch.bfloat16, False).transpose(1, 2) if transposed else (
        _values((E, K, N), seed, torch.bfloat16, False))
    d_ref, s_ref = ref.quantize(w, dim, rounding)
    d_tri, s_tri = tri.quantize(w, dim, rounding)
    assert_bitwise_equal(d_tri, d_ref)
    assert_bitwise_equal(s_tri, s_ref)
    assert_bitwise_equal(tri.quantize_dequantize(w, dim, rounding), ref.quantize_dequantize(w, dim, rounding))


@SETTINGS
@given(g=groups(), K=st.sampled_from([32, 48, 96]), rounding=ROUNDING, dtype=DTYPE,
       specials=st.booleans(), seed=st.integers(0, 2**16))
def test_quantize_groups(g, K, rounding, dtype, specials, seed):
    sizes, M = g
    offs = make_offs(sizes)
    x = _values((M, K), seed, dtype, specials and M > 80)
    d_ref, s_ref = ref.quantize_groups(x, offs, rounding)
    d_tri, s_tri = tri.quantize_groups(x, offs, rounding)
    assert_bitwise_equal(d_tri, d_ref)
    assert_bitwise_equal(s_tri, s_ref)
    assert_bitwise_equal(
        tri.quantize_dequantize_groups(x, offs, rounding), ref.quantize_dequantize_groups(x, offs, rounding)
    )


@SETTINGS
@given(rows=st.integers(1, 300), cols=st.integers(1, 9), E=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_to_blocked(rows, cols, E, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (E, rows, cols) if E else (rows, cols)
    s = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu)
    assert_bitwise_equal(tri.to_blocked(s), ref.to_blocked(s))


@SETTINGS
@given(g=groups(max_groups=8), cols=st.integers(1, 9), along=st.sampled_from(["rows", "cols"]),
       seed=st.integers(0, 2**16))
def test_to_blocked_groups(g, cols, along, seed):
    sizes, M = g
    offs = make_offs(sizes)
    gen = torch.Generator().manual_seed(seed)
    # "rows": one scale row per token; "cols": `cols` is the feature dim and columns are 32-token blocks
    shape = (M, cols) if along == "rows" else (cols * 37, ref.group_scale_rows(M, len(sizes)))
    s = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).view(torch.float8_e8m0fnu)
    b_ref, st_ref = ref.to_blocked_groups(s, offs, along)
    b_tri, st_tri = tri.to_blocked_groups(s, offs, along)
    assert_bitwise_equal(b_tri, b_ref)
    assert torch.equal(st_tri, st_ref)


@SETTINGS
@given(g=groups(), K=st.sampled_from([32, 64]), rounding=ROUNDING, seed=st.integers(0, 2**16))
def test_native_operands(g, K, rounding, seed):
    """The fused quantizers that write blocked scales (and padded wgrad data) match reference compositions."""
    sizes, M = g
    offs = make_offs(sizes)
    x = _values((M, K), seed, torch.bfloat16, False)
    for got, want in zip(tri.quantize_rows_blocked(x, offs, rounding), ref.quantize_rows_blocked(x, offs, rounding)):
        assert_bitwise_equal(got, want)
    got = tri.quantize_groups_blocked(x, offs, rounding)
    want = ref.quantize_groups_blocked(x, offs, rounding)
    for a, b in zip(got[:2], want[:2]):
        assert_bitwise_equal(a, b)
    assert torch.equal(got[2], want[2])
    w = _values((len(sizes), 48, K), seed, torch.bfloat16, False)
    for a, b in zip(tri.quantize_weight_blocked(w, rounding), ref.quantize_weight_blocked(w, rounding)):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("sizes", [[70], [5, 0, 70, 31]])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("x_transposed", [False, True])
def test_weight_gradient_operand_of_one_and_several_groups(sizes, dtype, x_transposed):
    """quantize_groups_blocked stores its data transposed (the "transposing" tile): with one
    group and several, bf16 and fp32, special values, and an input that is itself a transposed
    view (then no store transposes: the "one_group" and "groups" tiles): bit-exact."""
    offs = make_offs(sizes)
    x = _values((sum(sizes) + 3, 96), len(sizes), dtype, True)
    if x_transposed:
        x = x.t().contiguous().t()
    got, want = tri.quantize_groups_blocked(x, offs), ref.quantize_groups_blocked(x, offs)
    for a, b in zip(got[:2], want[:2]):
        assert_bitwise_equal(a, b)
    assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("tiles", [
    {"rows": (2, 16, 3, 1, 0), "cols": (1, 16, 3, 1, 1), "one_group": (2, 16, 2, 1, 0), "groups": (2, 16, 3, 1, 1),
     "transposing": (2, 16, 3, 1, 2)},
    {"rows": (1, 32, 2, 2, 2), "cols": (2, 32, 2, 2, 3), "one_group": (1, 16, 3, 1, 2), "groups": (1, 16, 4, 1, 3),
     "transposing": (1, 32, 2, 2, 0)},
])
def test_programs_of_several_column_tiles(monkeypatch, tiles):
    """Programs looping over several column tiles (the last one ragged, some past the end) after
    one group lookup, on a 2-D grid or walking bands of 1-3 row strips (the last band short):
    every quantizer layout still bit-exact, groups empty and unaligned, or one."""
    monkeypatch.setattr(tri, "TILES", tiles)
    offs, one = make_offs([70, 0, 33, 1, 64]), make_offs([150])
    x = _values((171, 80), 7, torch.bfloat16, True)
    for got, want in ((tri.quantize_groups(x, offs), ref.quantize_groups(x, offs)),
                      (tri.quantize_groups(x, one), ref.quantize_groups(x, one)),
                      (tri.quantize_groups_blocked(x, offs)[:2], ref.quantize_groups_blocked(x, offs)[:2]),
                      (tri.quantize_groups_blocked(x, one)[:2], ref.quantize_groups_blocked(x, one)[:2]),
                      (tri.quantize_rows_blocked(x[:, :64], offs), ref.quantize_rows_blocked(x[:, :64], offs)),
                      ([tri.quantize_dequantize_groups(x, offs)], [ref.quantize_dequantize_groups(x, offs)])):
        for a, b in zip(got, want):
            assert_bitwise_equal(a, b)
    for dim, (N, K) in ((1, (80, 96)), (2, (64, 80))):  # weights [E, K, N] as views of [E, N, K], along K and N
        w = _values((2, N, K), 8, torch.bfloat16, True).transpose(1, 2)
        assert_bitwise_equal(tri.quantize_dequantize(w, dim), ref.quantize_dequantize(w, dim))
    w_EKN = _values((2, 64, 96), 9, torch.bfloat16, True).transpose(1, 2)  # quantized along N, stored transposed
    for a, b in zip(tri.quantize_weight_blocked(w_EKN), ref.quantize_weight_blocked(w_EKN)):
        assert_bitwise_equal(a, b)


def _every_quantizer(mod, x, w, offs) -> list[torch.Tensor]:
    """The outputs of each quantizer of `mod` (tri or ref) for tokens x, weights w and group ends offs."""
    w_ENK = w.transpose(1, 2)
    return [*mod.quantize(x, 1), mod.quantize_dequantize(x, 1), mod.quantize_dequantize(w, 1),
            *mod.quantize_groups(x, offs), mod.quantize_dequantize_groups(x, offs),
            *mod.quantize_rows_blocked(x, offs), *mod.quantize_groups_blocked(x, offs),
            *mod.quantize_weight_blocked(w_ENK)]


def test_repeated_calls_launch_the_bound_kernel_with_their_own_tensors(monkeypatch):
    """A second call with new values and new group ends of the same shapes takes the launch bound
    by the first (one per quantizer and layout; the quantize-dequantize wrappers skip to it by
    their own plans) and must read and write its own tensors: bit-exact."""
    monkeypatch.setattr(launch, "_bound", {})
    monkeypatch.setattr(tri, "_plans", {})
    bound = []
    for seed, sizes in enumerate(([70, 0, 33], [5, 64, 34])):  # same group count and rows, other ends
        offs = make_offs(sizes)
        x = _values((106, 64), seed, torch.bfloat16, True)
        w = _values((3, 96, 64), seed, torch.bfloat16, True).transpose(1, 2)  # [E, K, N], K contiguous
        for got, want in zip(_every_quantizer(tri, x, w, offs), _every_quantizer(ref, x, w, offs), strict=True):
            assert_bitwise_equal(got, want)
        bound.append((len(launch._bound), len(tri._plans)))
    assert bound == [(8, 3), (8, 3)]


@pytest.mark.parametrize("sizes", [[40, 0, 7], [47]])
def test_rows_past_the_last_group_are_zeroed_by_several_tail_programs(sizes):
    """1100 rows past offs[-1]: several tail programs, each zeroing several chunks, with either tile."""
    offs = make_offs(sizes)
    x = _values((sum(sizes) + 1100, 32), 3, torch.bfloat16, False)
    assert_bitwise_equal(tri.quantize_dequantize_groups(x, offs), ref.quantize_dequantize_groups(x, offs))
    for got, want in zip(tri.quantize_groups(x, offs), ref.quantize_groups(x, offs)):
        assert_bitwise_equal(got, want)


@pytest.mark.parametrize("sizes", [[70, 0, 33, 1], [64]])
def test_every_output_byte_is_written(monkeypatch, sizes):
    """Outputs come from torch.empty: poisoned here, every byte of every quantizer's outputs must
    still match the reference (padding and rows past the last group end included)."""
    offs = make_offs(sizes)
    x = _values((sum(sizes) + 45, 64), 4, torch.bfloat16, True)
    w = _values((3, 96, 64), 4, torch.bfloat16, True).transpose(1, 2)
    want = _every_quantizer(ref, x, w, offs)
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan") if t.is_floating_point() else 0x5A if t.dtype == torch.uint8 else -7)

    monkeypatch.setattr(torch, "empty", poisoned)
    got = _every_quantizer(tri, x, w, offs)
    monkeypatch.undo()
    for a, b in zip(got, want, strict=True):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("sizes", [[0], [0, 0, 0]])
def test_weight_gradient_operand_of_no_tokens(sizes):
    """No rows: no kernel runs, and the padded group ends still come back (all 0)."""
    offs = make_offs(sizes)
    x = torch.zeros(0, 64)
    got, want = tri.quantize_groups_blocked(x, offs), ref.quantize_groups_blocked(x, offs)
    for a, b in zip(got[:2], want[:2]):
        assert_bitwise_equal(a, b)
    assert torch.equal(got[2], want[2])


def test_bad_inputs_raise():
    x = torch.randn(4, 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        tri.quantize(x)
    with pytest.raises(ValueError, match="bf16 or fp32"):
        tri.quantize(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="rounding"):
        tri.quantize(torch.randn(4, 32), rounding="nearest")
    with pytest.raises(ValueError, match="int32"):
        tri.quantize_groups(torch.randn(64, 32), torch.tensor([64]))


@pytest.mark.parametrize(
    "x", [torch.empty(64), torch.empty(128)[::2], torch.empty(64, 96), torch.empty(96, 64).t(),
          torch.empty(4, 64, 96), torch.empty(4, 96, 64).transpose(1, 2), torch.empty(64, 4, 96).permute(1, 0, 2),
          torch.empty(64, 96)[:, :64], torch.empty(64, 1)], ids=lambda x: f"{tuple(x.shape)}{x.stride()}")
def test_view3_has_the_geometry_of_the_view_it_stands_for(x):
    """The kernels get the base tensor and computed 3-D geometry: it must be that of the view
    X[b, r, c] with blocks along r (shape, strides and data pointer), so specialization and
    indexing match the view ops it replaces."""
    for dim in range(-x.dim(), x.dim()):
        d = dim % x.dim()
        if x.dim() == 1:
            view = x.view(1, -1, 1)
        elif x.dim() == 2:
            view = x.permute(d, 1 - d).unsqueeze(0)
        else:
            b = 0 if d != 0 else 1
            view = x.permute(b, d, 3 - b - d)
        v3 = tri._view3(x, dim)
        assert (v3.shape, v3.strides, v3.t.data_ptr()) == (tuple(view.shape), view.stride(), view.data_ptr())


_CAST_PTX = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mxfp8_inductor.kernels import triton_common


@triton.jit
def cast(x_ptr, y_ptr, inv):
    i = tl.arange(0, 128)
    tl.store(y_ptr + i, triton_common.scaled_to_e4m3(tl.load(x_ptr + i), inv, True))


src = ASTSource(cast, {"x_ptr": "*fp32", "y_ptr": "*u8", "inv": "fp32"})
print(triton.compile(src, target=GPUTarget("cuda", int(sys.argv[1]), 32)).asm["ptx"])
"""


@pytest.mark.parametrize("capability", [90, 100])
def test_gpu_float8_cast_saturates(tmp_path, capability):
    """On GPUs `scaled_to_e4m3` has no clamp: it relies on Triton casting fp32 to float8_e4m3fn
    with cvt.rn.satfinite (saturate to +-448, NaN kept), which FLOOR scales need (their block
    maxima reach 511). The interpreter cannot show this, so read the PTX Triton builds for Hopper
    and Blackwell (in a process without the interpreter; no GPU needed): a cast without
    .satfinite would turn values past 464 into NaN there."""
    import os
    import subprocess
    import sys

    script = tmp_path / "cast_ptx.py"
    script.write_text(_CAST_PTX)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ptx = subprocess.run([sys.executable, str(script), str(capability)], env=env, capture_output=True,
                         text=True, check=True).stdout
    casts = [line for line in ptx.splitlines() if "cvt" in line and "e4m3" in line]
    assert casts and all("cvt.rn.satfinite.e4m3x2.f32" in line for line in casts), casts
