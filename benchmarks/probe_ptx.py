"""Global and shared memory instructions of the MXFP8 quantizer as Triton builds it for sm_90,
without a GPU (Triton's bundled ptxas and cuobjdump): are the loads and stores 16 bytes wide, and
how many machine instructions does each thread issue per element it handles?

    python benchmarks/probe_ptx.py [--dump DIR]

Instructions per element matter because the H200 issues about 33 T thread-instructions/s (132
SMs x 4 schedulers x 32 lanes x ~1.98 GHz) and copies about 1 T bf16 elements/s each way: a
quantize-dequantize issuing ~30 instructions per element is bound by issue, not by memory.

Each case compiles `_mx_quant_kernel` with the constants and the integer and pointer
specialization (divisible by 16, strides of 1 as constants) that its launch gets at the MoE and
16384x16384 shapes. The counts are of instructions in the PTX, not of executions: a tail branch
that never runs at those shapes still shows its byte stores.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from mxfp8_inductor.kernels import triton_mx as tri  # noqa: E402

POINTERS = ("x_ptr", "y_ptr", "s_ptr", "r_ends_ptr", "pends_ptr", "s_ends_ptr")
# every case's constants but those it names: a quantize-dequantize across rows of one ungrouped
# tensor, x contiguous along its columns
BASE = dict(RCEIL=True, OUT_BF16=True, HW_CVT=True, G_S=1, GP_S=1, sx_c=1, DEQUANT=True,
            SCALE_MODE=0, PAD_Y=False, GROUPED=False, G_R=1, GP_R=1, CITERS=1, BAND=0)
DEQUANT, TRANSPOSING = dict(sy_c=1), dict(sy_r=1, DEQUANT=False)  # y like x / y transposed (fp8 data)
# (x, y, scales) element types, constants (the tile of `triton_mx.TILES`, the mode), warps
CASES = {
    "qdq across rows (cols tile)": (("bf16", "bf16", "bf16"), dict(DEQUANT, NB=1, BLOCK_C=128), 2),
    "qdq one group (int16 bits)": (("i16", "i16", "i16"), dict(DEQUANT, GROUPED=True, NB=1, BLOCK_C=128), 2),
    "qdq 8 groups (int16 bits)": (("i16", "i16", "i16"), dict(
        DEQUANT, GROUPED=True, G_R=8, GP_R=8, NB=1, BLOCK_C=64, CITERS=4, BAND=1), 2),
    "weights_along_N_blocked (transposing)": (("bf16", "u8", "u8"), dict(
        TRANSPOSING, SCALE_MODE=2, NB=1, BLOCK_C=128), 2),
    "groups_along_tokens_blocked one group (transposing)": (("bf16", "u8", "u8"), dict(
        TRANSPOSING, SCALE_MODE=1, PAD_Y=True, GROUPED=True, NB=1, BLOCK_C=128), 2),
}


def sass_instructions(cubin: bytes) -> int:
    """Machine instructions in the kernel (static count: each appears once however often it runs)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"/\*[0-9a-f]{4}\*/\s+\S", sass))


def compile_kernel(types: tuple[str, str, str], consts: dict, warps: int):
    """`_mx_quant_kernel` built for sm_90 with `consts` (complete: BASE and a case's own)."""
    fn = tri._mx_quant_kernel
    ptr_types = dict(zip(POINTERS, (*(f"*{t}" for t in types), "*i32", "*i32", "*i32")))
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        signature[name] = "constexpr" if name in consts else ptr_types.get(name, "i32")
        if name not in consts and name not in ("n_main", "n_r"):  # pointers, sizes and strides: % 16
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dump", type=pathlib.Path, help="write each case's PTX here")
    args = p.parse_args()
    for name, (types, own, warps) in CASES.items():
        consts = {**BASE, **own}
        kernel = compile_kernel(types, consts, warps)
        ptx = kernel.asm["ptx"]
        counts = collections.Counter(re.findall(r"(?:ld|st)\.(?:global|shared)[\w.]*", ptx))
        per_thread = consts["NB"] * 32 * consts["BLOCK_C"] * consts["CITERS"] // (32 * warps)
        print(f"{name}: {sass_instructions(kernel.asm['cubin']) / per_thread:.1f} SASS instructions per element"
              f" per thread (static); " + ", ".join(f"{op} {n}" for op, n in sorted(counts.items())))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / (re.sub(r"\W+", "_", name).strip("_") + ".ptx")).write_text(ptx)


if __name__ == "__main__":
    main()
