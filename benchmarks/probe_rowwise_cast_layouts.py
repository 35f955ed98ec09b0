"""Probe: where the rowwise weight-gradient cast kernel should transpose its tile, on the GPU.

    python benchmarks/probe_rowwise_cast_layouts.py

The kernel reads tokens along rows and writes them transposed (features along rows). Modes, each
checked bit-exact against `triton_rowwise.quantize_groups` and timed against a copy:
  0  transpose the float8 bytes after casting (the shipped kernel's way);
  1  transpose the bf16 bits as loaded, then widen, scale and cast in the store layout;
  2  pointers laid out transposed, no explicit transpose;
  3  pack 4 tokens per int32 word, transpose the words.
The scale per element assumes at most two groups per token tile (true for these shapes); the
shipped kernel also handles more.
"""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from mxfp8_inductor.kernels import rowwise, triton_rowwise as tr  # noqa: E402
from mxfp8_inductor.kernels.triton_mx import (  # noqa: E402
    _bits, _inv_scale, _load_f32, _scale_exponent, _scaled_to_e4m3, cdiv, pow2,
)
from shapes import TOKENS, uneven_counts  # noqa: E402


@triton.jit
def _cast_probe_kernel(x_ptr, sx_m, offs_ptr, amax_ptr, y_ptr, K, Mp, G: tl.constexpr, GP: tl.constexpr, ALIGN: tl.constexpr,
       BM: tl.constexpr, BK: tl.constexpr, KITERS: tl.constexpr, MODE: tl.constexpr):
    j = tl.program_id(0) * BM + tl.arange(0, BM)
    g, src, row_ok, _ = tr._padded_token_source(offs_ptr, j, G, GP, ALIGN)
    x_row = x_ptr + src.to(tl.int64) * sx_m
    g_lo = tl.minimum(tl.min(g, 0), G - 1)
    g_hi = tl.minimum(tl.max(g, 0), G - 1)
    for t in range(KITERS):
        k = (tl.program_id(1) * KITERS + t) * BK + tl.arange(0, BK)
        k_ok = k < K
        inv_lo = _inv_scale(_scale_exponent(tl.load(amax_ptr + g_lo * K + k, mask=k_ok, other=0.0), True))
        inv_hi = _inv_scale(_scale_exponent(tl.load(amax_ptr + g_hi * K + k, mask=k_ok, other=0.0), True))
        if MODE == 0:  # transpose fp8 bytes
            m = row_ok[:, None] & k_ok[None, :]
            x = _load_f32(x_row[:, None] + k[None, :], m)
            inv = tl.where((g <= g_lo)[:, None], inv_lo[None, :], inv_hi[None, :])
            q8 = tl.where(m, _scaled_to_e4m3(x, inv, True), 0)
            tl.store(y_ptr + k.to(tl.int64)[:, None] * Mp + j[None, :], tl.trans(q8), mask=k_ok[:, None] & (j < Mp)[None, :])
        elif MODE == 1:  # transpose the bf16 bits, compute in the store layout
            m = row_ok[:, None] & k_ok[None, :]
            bits = tl.trans(tl.load(x_row[:, None] + k[None, :], mask=m, other=0))
            x = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
            inv = tl.where((g <= g_lo)[None, :], inv_lo[:, None], inv_hi[:, None])
            q8 = _scaled_to_e4m3(x, inv, True)
            tl.store(y_ptr + k.to(tl.int64)[:, None] * Mp + j[None, :], q8, mask=k_ok[:, None] & (j < Mp)[None, :])
        elif MODE == 2:  # pointers laid out transposed, no explicit trans
            m = k_ok[:, None] & row_ok[None, :]
            x = _load_f32(x_row[None, :] + k[:, None], m)
            inv = tl.where((g <= g_lo)[None, :], inv_lo[:, None], inv_hi[:, None])
            q8 = tl.where(m, _scaled_to_e4m3(x, inv, True), 0)
            tl.store(y_ptr + k.to(tl.int64)[:, None] * Mp + j[None, :], q8, mask=k_ok[:, None] & (j < Mp)[None, :])
        else:  # pack 4 tokens per int32 word, transpose words
            m = row_ok[:, None] & k_ok[None, :]
            x = _load_f32(x_row[:, None] + k[None, :], m)
            inv = tl.where((g <= g_lo)[:, None], inv_lo[None, :], inv_hi[None, :])
            q8 = tl.where(m, _scaled_to_e4m3(x, inv, True), 0)
            w = tl.reshape(q8.to(tl.int32), [BM // 4, 4, BK])
            sh = (tl.arange(0, 4) * 8)[None, :, None]
            word = tl.sum(w << sh, axis=1)
            jw = tl.program_id(0) * (BM // 4) + tl.arange(0, BM // 4)
            tl.store(y_ptr.to(tl.pointer_type(tl.int32)) + k.to(tl.int64)[:, None] * (Mp // 4) + jw[None, :], tl.trans(word),
                     mask=k_ok[:, None] & (jw < Mp // 4)[None, :])


def main() -> None:
    for name, (M, K, G) in {"dsv3 x": (TOKENS, 7168, 8), "fine64 x": (TOKENS, 2048, 64)}.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)
        dst = torch.empty_like(x)
        copy_ms = do_bench(lambda: dst.copy_(x), return_mode="median")
        want = tr.quantize_groups(x, offs)[0].view(torch.uint8)
        amax = tr.group_amax(x, offs)
        Mp = rowwise.padded_rows(M, G)
        for mode in range(4):
            for (bm, bk, ki, w) in [(32, 128, 8, 4), (64, 128, 4, 4), (128, 64, 4, 4), (64, 256, 2, 8)]:
                y = torch.zeros(K, Mp, dtype=torch.uint8, device="cuda")
                f = lambda: _cast_probe_kernel[(cdiv(Mp, bm), cdiv(K, bk * ki))](_bits(x), x.stride(0), offs, amax, y, K, Mp, G=G, GP=pow2(G), ALIGN=16, BM=bm, BK=bk, KITERS=ki, MODE=mode, num_warps=w)
                try:
                    f()
                    ok = torch.equal(y, want)
                    ms = do_bench(f, return_mode="median")
                    print(f"{name:<9} mode={mode} tile={(bm, bk, ki, w)} {ms:7.3f} ms {copy_ms * 0.75 / ms:5.2f}x copy exact={ok}", flush=True)
                except Exception as e:
                    print(f"{name:<9} mode={mode} tile={(bm, bk, ki, w)} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
