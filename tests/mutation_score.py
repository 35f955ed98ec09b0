"""Mutation score: one-line bugs planted in the package, each of which the tests must catch.

Each mutation names a package file, an exact original text (found exactly once, so the list stays in
step with the code: the script fails loudly otherwise), its replacement (one changed line), and the
pytest selection that must catch it. For each, the repository's package and tests are copied into a
scratch directory, the change is applied there, and the selection runs on the copy (PYTHONPATH puts
it ahead of the editable install; checked once per run): pytest exit code 1 is caught, 0 survived,
anything else an error. First, unless --no-baseline, every selection runs on an unmutated copy and
must pass, so that a test failing for another reason cannot count as a catch.

    .venv/bin/python tests/mutation_score.py [--only NAME ...] [--jobs 2] [--no-baseline] [--list]

Not collected by pytest (its name does not start with test_). Exits 1 if a mutation survives or
errs, 2 if a baseline selection fails. In CI, tests/test_mutation_score.py checks the list against
the code in the fast tier and runs the whole score (--jobs 2, about 8 minutes on two cores) in the
slow one.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "mxfp8_inductor"
# what a scratch copy holds: the package, the tests, and what the tests read (tests/models.py
# imports examples/; pyproject.toml sets pytest's rootdir and options)
COPIED = (PACKAGE, "tests", "docs", "examples", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.bak", ".hypothesis", ".pytest_cache")
# a fixed hypothesis seed: the same examples in every run, baseline and mutated alike
BASELINE_PYTEST = ("-q", "-m", "not slow", "-p", "no:cacheprovider", "--hypothesis-seed=0")
PYTEST = ("-x", *BASELINE_PYTEST)
TIMEOUT_S = 900

CONTRACT = "tests/test_contract.py"
REFERENCE = "tests/kernels/test_reference.py"
ROWWISE = "tests/kernels/test_rowwise.py"
WEIGHTS = "tests/lowering/test_weight_cache.py"
AUTO = "tests/lowering/test_auto.py"
TARGETS = "tests/test_mutation_targets.py"


@dataclasses.dataclass(frozen=True)
class Mutation:
    """A one-line change to `path` (relative to the package) and the pytest arguments that must
    catch it. `old` may span lines around the changed one where the line alone is not unique."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    # ---- the seven of issue 39
    Mutation("mxfp8_rounding_ignored", "lowering/mxfp8.py",
             "quantize_dequantize(x, dim, rounding, OUT_DTYPE)",
             'quantize_dequantize(x, dim, "rceil", OUT_DTYPE)',
             (CONTRACT, "-k", "grouped_mm_matches_contract and E4-mxfp8-floor")),
    Mutation("mxfp8_wgrad_blocks_straddle_groups", "lowering/mxfp8.py",
             "a_q = quantize_dequantize_groups_op(a_MK, offs, rounding)",
             "a_q = quantize_dequantize_groups_op(a_MK, offs[-1:], rounding)",
             (CONTRACT, "-k", "grouped_mm_matches_contract and E4-mxfp8")),
    Mutation("mxfp8_dgrad_weight_along_K", "lowering/mxfp8.py",
             "w_q_EKN = quantize_dequantize_op(b, 2 if dgrad else 1, rounding)",
             "w_q_EKN = quantize_dequantize_op(b, 1, rounding)",
             (CONTRACT, "-k", "grouped_mm_matches_contract and E4-mxfp8")),
    Mutation("reference_rceil_floor_swapped", "kernels/reference.py",
             'if rounding == "rceil":',
             'if rounding == "floor":',
             (REFERENCE,)),
    Mutation("wgrad_transpose_dropped", "lowering/autograd.py",
             "db = (db.transpose(-2, -1) if swap else db).to(b.dtype)",
             "db = db.to(b.dtype)",
             (CONTRACT, "-k", "grouped_mm_matches_contract and E4-mxfp8-rceil-quantized")),
    Mutation("group_end_clamp_dropped", "kernels/reference.py",
             "torch.cummax(offs.clamp(0, rows), 0)",
             "torch.cummax(offs, 0)",
             ("tests/kernels/test_bad_offs.py", "-k", "group_ends")),
    Mutation("backward_forced_bf16", "lowering/autograd.py",
             "ctx.save_for_backward(a, b, offs, param)\n"
             "        ctx.input_grad, ctx.weight_grad = input_grad, weight_grad",
             "ctx.save_for_backward(a, b, offs, param)\n"
             '        ctx.input_grad, ctx.weight_grad = "bf16:rceil", "bf16:rceil"',
             (CONTRACT, "-k", "grouped_mm_matches_contract and E4-mxfp8-rceil-quantized")),
    # ---- scale layouts and group offsets
    Mutation("blocked_tile_rows_transposed", "kernels/reference.py",
             "tiles = padded.view(Hp // 128, 4, 32, Wp // 4, 4).permute(0, 3, 2, 1, 4)",
             "tiles = padded.view(Hp // 128, 4, 32, Wp // 4, 4).permute(0, 3, 1, 2, 4)",
             (REFERENCE, "-k", "to_blocked")),
    Mutation("blocked_group_cols_unpadded", "kernels/reference.py",
             "padded = ((sizes + BLOCK - 1) // BLOCK + 3) // 4 * 4",
             "padded = (sizes + BLOCK - 1) // BLOCK",
             (REFERENCE, "-k", "to_blocked_groups")),
    Mutation("blocked_group_rows_padded_to_32", "kernels/reference.py",
             "padded = (sizes + 127) // 128 * 128",
             "padded = (sizes + 31) // 32 * 32",
             (REFERENCE, "-k", "to_blocked_groups")),
    Mutation("group_scale_rows_misplaced", "kernels/reference.py",
             "nblk = -(-(end - start) // BLOCK)",
             "nblk = (end - start) // BLOCK + 1",
             (CONTRACT, "-k", "public_quantize_groups")),
    Mutation("padded_group_offs_round_down", "kernels/reference.py",
             "return torch.cumsum((sizes + align - 1) // align * align, 0, dtype=torch.int32)",
             "return torch.cumsum(sizes // align * align, 0, dtype=torch.int32)",
             (CONTRACT, "-k", "grouped_mm_matches_contract and E4-fp8_rowwise-rceil-quantized")),
    Mutation("rowwise_padding_reads_next_group", "kernels/rowwise.py",
             "valid = (src < offs[g])[:, None]",
             "valid = (src >= 0)[:, None]",
             (ROWWISE, "-k", "group_quantization_layout")),
    Mutation("rowwise_group_ids_off_by_one", "kernels/rowwise.py",
             "torch.arange(n, device=ends.device, dtype=ends.dtype), right=True)",
             "torch.arange(n, device=ends.device, dtype=ends.dtype), right=False)",
             (ROWWISE, "-k", "group_amax_ignores or group_quantization_layout")),
    Mutation("fp8_gemm_2d2d_reads_past_group_end", "kernels/triton_fp8_gemm.py",
             "a_desc = tl.make_tensor_descriptor(a_ptr, [K, end], [s_ak, 1], [BM, BK])",
             "a_desc = tl.make_tensor_descriptor(a_ptr, [K, T], [s_ak, 1], [BM, BK])",
             ("tests/kernels/test_triton_fp8_gemm.py", "-k", "2d2d")),
    Mutation("fp8_gemm_2d2d_stores_to_the_first_group", "kernels/triton_fp8_gemm.py",
             "out.store([e, k0, n0], tc.bf16_tile(y, HW_CVT).reshape(1, BM, BN))",
             "out.store([0, k0, n0], tc.bf16_tile(y, HW_CVT).reshape(1, BM, BN))",
             ("tests/kernels/test_triton_fp8_gemm.py", "-k", "2d2d")),
    Mutation("fp8_gemm_2d2d_pointer_store_to_another_group", "kernels/triton_fp8_gemm.py",
             "ptr = out + e.to(tl.int64) * K * N + k.to(tl.int64)[:, None] * N + n[None, :]",
             "ptr = out + (e // 2).to(tl.int64) * K * N + k.to(tl.int64)[:, None] * N + n[None, :]",
             ("tests/kernels/test_triton_fp8_gemm.py", "-k", "2d2d")),
    Mutation("fp8_gemm_2d2d_drops_the_last_step", "kernels/triton_fp8_gemm.py",
             "steps = tl.where(readable, (end - start + BK - 1) // BK, 0)",
             "steps = tl.where(readable, (end - start) // BK, 0)",
             ("tests/kernels/test_triton_fp8_gemm.py", "-k", "2d2d")),
    Mutation("fp8_gemm_2d2d_run_misses_a_tile", "kernels/triton_fp8_gemm.py",
             "tiles = (r + 1) * n_tiles // runs - j0",
             "tiles = n_tiles // runs",
             ("tests/kernels/test_triton_fp8_gemm.py", "-k", "2d2d")),
    Mutation("fp8_gemm_2d2d_reads_unaligned_group", "kernels/triton_fp8_gemm.py",
             "readable = ((start % align == 0) & (end % align == 0)) | (start == end)",
             "readable = start >= 0",
             ("tests/kernels/test_triton_fp8_gemm.py", "-k", "off_multiples")),
    # ---- scale rules, saturation, the exponent cap, subnormal blocks
    Mutation("rowwise_scale_twice_the_max", "kernels/rowwise.py",
             "else ax.amax(dim, keepdim=True)",
             "else ax.amax(dim, keepdim=True) * 2",
             (ROWWISE, "-k", "scales_are_powers_of_two or floor_rounding")),
    Mutation("triton_rows_ignore_the_leading_dim", "kernels/triton_rowwise.py",
             "row = x_ptr + (r64 // A) * s0 + (r64 % A) * s1",
             "row = x_ptr + r64 * s1",
             (ROWWISE, "-k", "row_quantizer_is_bit_exact")),
    Mutation("triton_group_padding_reads_next_group", "kernels/triton_rowwise.py",
             "mask=(r < end)[:, None] & k_ok[None, :], other=0)",
             "mask=(r < M)[:, None] & k_ok[None, :], other=0)",
             (ROWWISE, "-k", "triton_group_quantizer")),
    Mutation("triton_group_programs_skip_slabs", "kernels/triton_rowwise.py",
             "for item in tl.range(tl.program_id(0), G * QB, tl.num_programs(0)):",
             "for item in tl.range(tl.program_id(0), G * QB, 2 * tl.num_programs(0)):",
             (ROWWISE, "-k", "triton_group_kernel_tiles")),
    Mutation("triton_group_tail_left_unwritten", "kernels/triton_rowwise.py",
             "for j0 in range(padded_end, Mp, BM):",
             "for j0 in range(Mp, Mp, BM):",
             (ROWWISE, "-k", "triton_group_quantizer")),
    # (the reference's own clamp to +-448 is not a target: torch's float8_e4m3fn cast saturates as
    # well, so on CPU dropping it changes nothing; the interpreter's integer encoder needs its clamp)
    Mutation("e4m3_saturation_dropped", "kernels/triton_common.py",
             "q = tl.where(q != q, q, tl.minimum(tl.maximum(q, -448.0), 448.0))",
             "q = q",
             (TARGETS, "-k", "saturates_floor")),
    Mutation("scale_exponent_cap_dropped", "kernels/reference.py",
             "biased = biased.clamp(0, MAX_FINITE_BYTE)",
             "biased = biased.clamp(0, 254)",
             (REFERENCE, "-k", "near_float32_limit or bf16_max")),
    Mutation("byte0_scale_flushed_to_zero", "kernels/reference.py",
             "bits = torch.where(biased > 0, biased << 23, 1 << 22)",
             "bits = torch.where(biased > 0, biased << 23, 0)",
             (CONTRACT, "-k", "special_blocks")),
    # ---- the weight cache
    Mutation("weight_cache_ignores_version", "lowering/weight_cache.py",
             "return (param._version, param.data_ptr()), (), (param.untyped_storage(),)",
             "return (0, param.data_ptr()), (), (param.untyped_storage(),)",
             (WEIGHTS, "-k", "every_change and eager and fp8_rowwise")),
    Mutation("weight_cache_key_ignores_kind", "lowering/weight_cache.py",
             "key = (w.storage_offset(), tuple(w.shape), w.stride(), kind)",
             "key = (w.storage_offset(), tuple(w.shape), w.stride())",
             (TARGETS, "-k", "own_rounding")),
    Mutation("weight_cache_storage_check_dropped", "lowering/weight_cache.py",
             "and w.device == param.device and w.untyped_storage()._cdata == param.untyped_storage()._cdata)",
             "and w.device == param.device)",
             (TARGETS, "-k", "outside_the_parameters_storage")),
    Mutation("weight_cache_same_storage_unchecked", "lowering/weight_cache.py",
             "and all(ref.cdata == s._cdata for ref, s in zip(self.storages, storages)))",
             ")",
             (WEIGHTS, "-k", "new_storage_at_the_old_address")),
    Mutation("weight_cache_fsdp2_sharded_version_ignored", "lowering/weight_cache.py",
             "numbers = (param._version, sharded._version, local._version, *(a.state() for a in self.aliases))",
             "numbers = (param._version, 0, local._version, *(a.state() for a in self.aliases))",
             (WEIGHTS, "-k", "fsdp2_writes and (copy_ or load_state_dict)")),
    Mutation("weight_cache_state_dict_aliases_ignored", "lowering/weight_cache.py",
             "numbers = (param._version, sharded._version, local._version, *(a.state() for a in self.aliases))",
             "numbers = (param._version, sharded._version, local._version)",
             (WEIGHTS, "-k", "fsdp2_writes and dcp_load")),
    Mutation("weight_cache_fsdp2_treated_as_plain", "lowering/weight_cache.py",
             "fsdp_param = None if self.fsdp is None else self.fsdp()",
             "fsdp_param = None",
             (WEIGHTS, "-k", "fsdp2_writes")),
    Mutation("fp8_all_gather_state_dict_aliases_ignored", "fsdp.py",
             "stamp = (_writes, dtype, weight_cache.state_dict_aliases(module).state())",
             "stamp = (_writes, dtype)",
             ("tests/test_fp8_all_gather_option.py", "-k", "once_per_update")),
    # ---- recipes per role, operands the pass and the ops pass on
    Mutation("auto_forward_and_dgrad_roles_swapped", "lowering/auto.py",
             'table)")\n    return Plan(tuple(impls), tuple(reasons))',
             'table)")\n    return Plan((impls[1], impls[0], impls[2]), tuple(reasons))',
             (AUTO, "-k", "each_role or pass_puts")),
    Mutation("per_call_choice_drops_the_spec", "lowering/dispatch.py",
             "return spec.with_impl(hit[1][ROLES.index(spec.role)])",
             "return GemmSpec(spec.role, hit[1][ROLES.index(spec.role)], dense=spec.dense)",
             ("tests/lowering/test_spec.py", "-k", "per_call")),
    Mutation("spec_reuse_flag_dropped_by_the_pass", "patterns/rewrite.py",
             "specs = site_specs(impls, rounding=config.rounding, reuse_weight=param is not None,",
             "specs = site_specs(impls, rounding=config.rounding, reuse_weight=False,",
             ("tests/lowering/test_spec.py", "-k", "pass_carries")),
    Mutation("auto_timed_choice_ignores_the_margin", "lowering/auto.py",
             'best = best if ms[best] < (1 - MARGIN) * ms["bf16"] else "bf16"',
             'best = best if ms[best] < ms["bf16"] else "bf16"',
             (AUTO, "-k", "autotune_times_each_role")),
    Mutation("auto_timing_drops_host_time", "lowering/measure.py",
             "return gpu_ms + _host_ms(host_fn or fn)",
             "return gpu_ms",
             (AUTO, "-k", "gpu_time_and_its_host_time")),
    Mutation("bound_descriptor_keeps_first_calls_tensor", "kernels/launch.py",
             "full[i] = new[j] if template is None else _over(template, new[j])",
             "full[i] = new[j] if template is None else _over(template, tensors[j])",
             ("tests/kernels/test_launch.py",)),
    Mutation("empty_launch_hook_chain_counts", "kernels/launch.py",
             'return hook is not None and getattr(hook, "calls", True) != []',
             "return hook is not None",
             ("tests/kernels/test_launch.py", "-k", "counts_where")),
    Mutation("auto_counts_host_time_under_cuda_graphs", "lowering/measure.py",
             'return recipe != "bf16" and role != Role.WEIGHT_GRAD and (cached or recipe == "mxfp8")',
             "return True",
             (AUTO, "-k", "cuda_graphs")),
    Mutation("weight_cache_reuses_into_a_capture", "lowering/weight_cache.py",
             "if not reusable(w, param) or _capturing(w) or (record := _record(param)) is None:",
             "if not reusable(w, param) or (record := _record(param)) is None:",
             (WEIGHTS, "-k", "capture_into")),
    Mutation("cached_weight_gemm_inside_cuda_graphs", "lowering/library.py",
             "return define(name, schema, impl, fake, tags=STATEFUL)",
             "return define(name, schema, impl, fake)",
             (WEIGHTS, "-k", "outside_cuda_graphs")),
    Mutation("rowwise_reused_weight_rounded_per_row", "lowering/rowwise.py",
             "w = _weight_operand(b_EKN, param, rounding, shared=True, dgrad=dgrad, decomposing=False)",
             "w = _weight_operand(b_EKN, param, rounding, shared=False, dgrad=dgrad, decomposing=False)",
             (WEIGHTS, "-k", "one_quantization")),
    Mutation("pass_chained_site_reads_replaced_node", "patterns/rewrite.py",
             "operands = tuple(replaced.get(x, x) if isinstance(x, torch.fx.Node) else x for x in operands)",
             "operands = tuple(x for x in operands)",
             ("tests/patterns/test_rewrite_cases.py", "-k", "chained")),
    Mutation("pass_keys_cache_on_operand_view", "patterns/rewrite.py",
             "return site.param_node if config.weight_cache else None",
             "return site.b if config.weight_cache else None",
             (TARGETS, "-k", "under_the_pass")),
)


@dataclasses.dataclass
class Result:
    name: str
    status: str  # "caught", "SURVIVED" or "error (rc N)"
    seconds: float
    detail: str


def problems(mutations: tuple[Mutation, ...]) -> list[str]:
    """Where a mutation no longer fits the code: its original text must occur exactly once in its
    file, the replacement must change exactly one line, and names must be unique. A fast test
    (tests/test_mutation_score.py) asserts there are none, so that the list moves with the code."""
    found = []
    for m in mutations:
        path = REPO / PACKAGE / m.path
        count = path.read_text().count(m.old) if path.exists() else None
        if count is None:
            found.append(f"{m.name}: no file {path}")
        elif count != 1:
            found.append(f"{m.name}: original text found {count} times in {path} (expected once): {m.old!r}")
        old, new = m.old.splitlines(), m.new.splitlines()
        if len(old) != len(new) or sum(a != b for a, b in zip(old, new)) != 1:
            found.append(f"{m.name}: the replacement must change exactly one line")
    names = [m.name for m in mutations]
    found += [f"duplicate mutation name {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    return found


def check(mutations: tuple[Mutation, ...]) -> None:
    """Fail loudly, before any run, where a mutation no longer fits the code (`problems`)."""
    found = problems(mutations)
    if found:
        sys.exit("mutation list out of step with the code:\n  " + "\n  ".join(found))


def _copy(dest: Path) -> None:
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=IGNORED)
        elif src.exists():
            shutil.copy2(src, dest / name)


def _env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(scratch), *filter(None, [env.get("PYTHONPATH")])])
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # compiled graphs must come from the mutated code: no cached FX graphs or AOTAutograd results
    # (the generated kernels' own cache is keyed by their source and stays on)
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    return env


def verify_import(workdir: Path) -> None:
    """Check that a run in a scratch copy imports the copy's package, not the editable install."""
    with tempfile.TemporaryDirectory(prefix="mutation-check-", dir=workdir) as tmp:
        scratch = Path(tmp)
        _copy(scratch)
        out = subprocess.run([sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"],
                             cwd=scratch, env=_env(scratch), capture_output=True, text=True, check=False)
        path = Path(out.stdout.strip() or "?").resolve()
        if out.returncode or scratch.resolve() not in path.parents:
            sys.exit(f"the scratch copy's package is not the one imported: got {out.stdout.strip()!r} "
                     f"{out.stderr.strip()[-2000:]}")


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split(" ", 1)[1]
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run(name: str, args: tuple[str, ...], mutation: Mutation | None, workdir: Path) -> Result:
    """Run pytest with `args` on a scratch copy of the repository with `mutation` applied (None:
    unmutated, a baseline)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutation-", dir=workdir) as tmp:
        scratch = Path(tmp)
        _copy(scratch)
        if mutation is not None:
            path = scratch / PACKAGE / mutation.path
            text = path.read_text()
            if text.count(mutation.old) != 1:  # the file changed since check()
                return Result(name, "error (text)", 0.0, f"original text not found once in {mutation.path}")
            path.write_text(text.replace(mutation.old, mutation.new))
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=scratch, env=_env(scratch),
                                  capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            rc, output = -1, f"timed out after {TIMEOUT_S} s"
    labels = ("SURVIVED", "caught") if mutation is not None else ("passed", "FAILED")
    status = labels[rc] if rc in (0, 1) else f"error (rc {rc})"
    detail = {0: "", 1: _first_failure(output)}.get(rc, "\n".join(output.strip().splitlines()[-15:]))
    return Result(name, status, time.monotonic() - start, detail)


def _parallel(jobs: int, calls: list[tuple]) -> list[Result]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run, *call) for call in calls]
        results = []
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            print(f"  {r.name}: {r.status} ({r.seconds:.0f} s)", flush=True)
            results.append(r)
    order = {call[0]: i for i, call in enumerate(calls)}
    return sorted(results, key=lambda r: order[r.name])


def baseline_runs(mutations: tuple[Mutation, ...], jobs: int) -> list[tuple[str, tuple[str, ...]]]:
    """pytest arguments that run every mutation's selection unmutated, in at most `jobs` processes:
    selections of a file or a file and -k merge into one -k over module names (a superset where a
    keyword also matches another selected file); any other selection runs alone."""
    merged: list[tuple[str, str]] = []
    alone: list[tuple[str, ...]] = []
    for sel in dict.fromkeys(m.tests for m in mutations):
        if len(sel) == 1 or (len(sel) == 3 and sel[1] == "-k"):
            module = Path(sel[0]).name
            merged.append((sel[0], f"({module} and ({sel[2]}))" if len(sel) == 3 else f"({module})"))
        else:
            alone.append(sel)
    runs = [(" ".join(sel), (*BASELINE_PYTEST, *sel)) for sel in alone]
    chunks = [merged[i::jobs] for i in range(min(jobs, len(merged)))]
    for i, chunk in enumerate(chunks):
        files = tuple(dict.fromkeys(f for f, _ in chunk))
        runs.append((f"baseline {i + 1}: {len(chunk)} selections in {', '.join(files)}",
                     (*BASELINE_PYTEST, *files, "-k", " or ".join(e for _, e in chunk))))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutation only (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="pytest processes at once")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the selections unmutated first")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)

    check(MUTATIONS)
    chosen = MUTATIONS
    if args.only:
        unknown = set(args.only) - {m.name for m in MUTATIONS}
        if unknown:
            parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
        chosen = tuple(m for m in MUTATIONS if m.name in args.only)
    if args.list:
        for m in chosen:
            print(f"{m.name:45} {m.path:22} {' '.join(m.tests)}")
        return 0

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutation-score-") as tmp:
        workdir = Path(tmp)
        verify_import(workdir)
        if not args.no_baseline:
            print("baseline: every selection on the unmutated code", flush=True)
            baseline = _parallel(args.jobs, [(name, a, None, workdir) for name, a in baseline_runs(chosen, args.jobs)])
            failed = [r for r in baseline if r.status != "passed"]
            for r in failed:
                print(f"a selection fails without a mutation ({r.name}): {r.status}\n{r.detail}")
            if failed:
                return 2
        print(f"mutations: {len(chosen)}", flush=True)
        results = _parallel(args.jobs, [(m.name, (*PYTEST, *m.tests), m, workdir) for m in chosen])

    width = max(len(r.name) for r in results)
    print(f"\n{'mutation':{width}}  {'result':12} {'seconds':>7}  first failure")
    for r in results:
        first = r.detail.splitlines()[0] if r.status == "caught" and r.detail else ""
        print(f"{r.name:{width}}  {r.status:12} {r.seconds:7.1f}  {first}")
    for r in results:
        if r.status not in ("caught", "SURVIVED"):
            print(f"\n{r.name}: {r.status}\n{r.detail}")
    caught = sum(r.status == "caught" for r in results)
    survived = [r.name for r in results if r.status == "SURVIVED"]
    print(f"\nscore: {caught}/{len(results)} caught ({100 * caught / len(results):.0f}%), "
          f"{len(survived)} survived{': ' + ', '.join(survived) if survived else ''}; "
          f"{time.monotonic() - started:.0f} s in all")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
