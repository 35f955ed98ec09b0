"""benchmarks/profile_layer.py: its classification of Inductor kernel sources, its lists of the
package's kernels, and (slow) the script itself on a CPU, a tiny model's bf16 and fp8_rowwise
steps profiled, every kernel classified, each class total the sum of its kernels, and --table
reprinting the saved file."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).parents[1]
SCRIPT = ROOT / "benchmarks" / "profile_layer.py"
sys.path.append(str(SCRIPT.parent))  # the benchmarks import each other as top-level modules

import profile_layer  # noqa: E402

# the parts of an Inductor Triton kernel's source that the classification reads
HEAD = """@triton_heuristics.persistent_reduction(
    triton_meta={{'signature': {{{signature}, 'xnumel': 'i32'}}, 'device': DeviceProperties(type='cuda')}},
    inductor_meta={{'kernel_name': 'triton_per_fused_0', 'kernel_num_gb': 0.0125}},
)
@triton.jit
def triton_per_fused_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
"""
ROWWISE = """    tmp0 = tl.load(in_ptr0 + (r0_1 + 2048*x0), xmask, other=0.0).to(tl.float32)
    tmp1 = tl_math.abs(tmp0)
    tmp4 = triton_helpers.max2(tl.where(xmask, tmp1, float("-inf")), 1)[:, None]
    tmp9 = triton_helpers.minimum(triton_helpers.maximum(tmp0 * (448.0 / tmp4), -448.0), 448.0)
    tl.store(out_ptr0 + (r0_1 + 2048*x0), tmp9.to(tl.float8e4nv), xmask)
"""
SWIGLU = """    tmp0 = tl.load(in_ptr0 + (r0_1 + 1536*x0), xmask, other=0.0).to(tl.float32)
    tmp1 = tl.load(in_ptr0 + (768 + r0_1 + 1536*x0), xmask, other=0.0).to(tl.float32)
    tmp2 = tmp0 * tl.sigmoid(tmp0) * tmp1
""" + ROWWISE
GATHER = """    tmp0 = tl.load(in_ptr1 + (x0 // 2048), xmask)
    tmp1 = tl.load(in_ptr0 + (x0 % 2048 + 2048*tmp0), xmask).to(tl.float32)
""" + ROWWISE
FP8 = "'in_ptr0': '*bf16', 'out_ptr0': '*fp8e4nv'"
F32 = "'in_ptr0': '*bf16', 'out_ptr0': '*fp32'"


@pytest.mark.parametrize("signature,body,expected", [
    (FP8, ROWWISE, ("quant_only", "")),
    (FP8, SWIGLU, ("producer+quant", "math: sigmoid")),
    (FP8, GATHER, ("producer+quant", "gather/scatter")),
    (F32, ROWWISE.replace("tmp9.to(tl.float8e4nv)", "tmp4"), ("quant_only", "abs-max only")),
    (F32, "    tmp0 = tl.load(in_ptr0 + (x0), xmask)\n    tmp1 = tl.sum(tmp0 * tmp0, 1)\n", ("other", "")),
    (F32, "    acc = tl.dot(a, b, acc)\n", ("gemm", "")),
], ids=["rowwise", "swiglu", "gather", "amax", "norm", "template"])
def test_inductor_source_classes(signature, body, expected):
    source = profile_layer.Source("triton_per_fused_0", HEAD.format(signature=signature) + body, "", "triton")
    assert source.classify() == expected
    assert source.num_gb == 0.0125


def test_package_kernel_lists():
    gemm = profile_layer.jit_names(profile_layer.GEMM_MODULES)
    quant = profile_layer.jit_names(profile_layer.QUANT_MODULES)
    assert {"_gemm_2d3d_kernel", "_gemm_2d2d_kernel", "_rows_kernel", "_groups_kernel", "_gemm_kernel"} <= gemm
    assert {"mx_quant_kernel", "_quantize_groups_kernel", "_quantize_rows_kernel", "_to_blocked_kernel"} <= quant
    assert not gemm & quant


def test_launch_classes():
    """A GPU profile's launches, each with the operator event that launched it."""
    quant = profile_layer.Source("triton_per_fused_0", HEAD.format(signature=FP8) + ROWWISE, "", "triton")
    sources = ({"/c/ab/cab.py": quant}, {"triton_per_fused_0": [quant]})
    package = {"gemm": profile_layer.jit_names(profile_layer.GEMM_MODULES),
               "quant": profile_layer.jit_names(profile_layer.QUANT_MODULES)}
    params = {(8, 128, 64), (8, 64, 128)}

    def launch(name, op_name, shapes=(), kwinputs=None):
        op = types.SimpleNamespace(name=op_name, input_shapes=[list(s) for s in shapes], kwinputs=kwinputs or {})
        row = profile_layer.classify(name, op, sources, params, package)
        return row["class"], row["operand"], row["gb"]

    inductor = {"kernel_file": "/c/ab/cab.py", "kernel_num_gb": 0.5}
    assert launch("triton_per_fused_0", "triton_per_fused_0", [(256, 64), (256, 64)], inductor) == (
        "quant_only", "activation", 0.5)
    assert launch("triton_per_fused_0", "triton_per_fused_0", [(8, 128, 64), (8, 64, 128)], inductor) == (
        "quant_only", "weight", 0.5)
    # no shapes recorded (a GPU profile's Inductor kernels): a cast fusing a transpose is a weight's,
    # a producer fusing one (SwiGLU's backward) an activation's
    cast_t = profile_layer.Source("triton_poi_fused_transpose_1", HEAD.format(signature=FP8) + ROWWISE, "", "triton")
    silu_t = profile_layer.Source("triton_poi_fused_silu_transpose_2", HEAD.format(signature=FP8) + SWIGLU, "",
                                  "triton")
    for src, want in ((cast_t, ("quant_only", "weight")), (silu_t, ("producer+quant", "activation"))):
        row = profile_layer.classify(src.name, None, ({}, {src.name: [src]}), params, package)
        assert (row["class"], row["operand"]) == want, src.name
    assert launch("_quantize_groups_kernel", "mxfp8::quantize_groups_rowwise", [(256, 64), (8,)]) == (
        "quant_only", "activation", None)
    assert launch("mx_quant_kernel", "mxfp8::quantize_dequantize", [(8, 128, 64), ()]) == ("quant_only", "weight", None)
    assert launch("_gemm_2d3d_kernel", "mxfp8::fp8_grouped_mm")[0] == "gemm"
    assert launch("cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<>>", "aten::_grouped_mm")[0] == "gemm"
    assert launch("void pytorch_flash::flash_fwd_kernel<>", "aten::_flash_attention_forward")[0] == "other"


@pytest.mark.slow
def test_script_on_cpu(tmp_path):
    # one process per variant, side by side (each is mostly a compile on one core)
    runs = {v: (tmp_path / f"{v}.json", subprocess.Popen(
        [sys.executable, str(SCRIPT), f"qwen3_30b:{v}", "--tiny", "--device", "cpu", "--warmup", "1",
         "--out", str(tmp_path / f"{v}.json")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for v in ("bf16", "fp8_rowwise")}
    for _, proc in runs.values():
        log = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, log[-3000:]
    for variant, (out, _) in runs.items():
        saved = json.loads(out.read_text())
        assert saved["gpu"] == "cpu" and "--tiny" in saved["command"] and not saved["failed"]
        [p] = saved["profiles"]
        assert (p["model"], p["variant"]) == ("qwen3_30b", variant)
        rows = p["kernels"]
        assert rows and {r["class"] for r in rows} <= set(profile_layer.CLASSES)
        for c, total in p["classes"].items():
            mine = [r for r in rows if r["class"] == c]
            assert total["kernels"] == len(mine) and total["calls"] == sum(r["calls"] for r in mine)
            assert total["ms"] == pytest.approx(sum(r["ms"] for r in mine))
            assert total["gb"] == pytest.approx(sum(r["gb"] for r in mine if r["gb"] is not None))
        assert p["kernel_ms"] == pytest.approx(sum(t["ms"] for t in p["classes"].values()))
        bar = [r for r in rows if r["class"] == "quant_only" and r["operand"] == "activation"]
        assert p["quant_only_activation"] == {"kernels": len(bar), "ms": pytest.approx(sum(r["ms"] for r in bar))}
        for r in rows:
            quantizes = r["class"] in ("quant_only", "producer+quant")
            assert (r["operand"] in ("weight", "activation")) if quantizes else r["operand"] is None
        # bf16 quantizes nothing; fp8_rowwise's weight-gradient operands go through the package's op
        quant = [r for r in rows if r["class"] == "quant_only"]
        assert bool(quant) == (variant == "fp8_rowwise")
    table = subprocess.run([sys.executable, str(SCRIPT), "--table", str(runs["fp8_rowwise"][0])], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "==== qwen3_30b fp8_rowwise" in table.stdout and "quant_only on activations" in table.stdout
