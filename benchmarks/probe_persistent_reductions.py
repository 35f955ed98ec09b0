"""The MoE block benchmark with Inductor's persistent-reduction threshold raised (PERSIST = the
largest row that a reduction keeps in registers instead of looping over twice; Inductor's own
is 1024), to see whether fp8_rowwise's Inductor-generated row quantizers gain from it:

    PERSIST=16384 python benchmarks/probe_persistent_reductions.py --recipes fp8_rowwise --shapes dsv3,l4scout

Run each setting in its own process with its own TORCHINDUCTOR_CACHE_DIR, or the FX-graph cache
serves the other setting's kernels.
"""
import os
import runpy

from torch._inductor import choices
from torch._inductor.runtime.hints import ReductionHint
from torch._inductor.virtualized import V

THRESHOLD = int(os.environ.get("PERSIST", "0"))
if THRESHOLD:
    inductor_rule = choices.InductorChoices.should_use_persistent_reduction

    def rule(features, cooperative_reduction, *args, **kwargs):
        if features.get_reduction_hint() == ReductionHint.INNER and V.graph.sizevars.statically_known_leq(
            features.reduction_numel, THRESHOLD
        ):
            return True
        return inductor_rule(features, cooperative_reduction, *args, **kwargs)

    choices.InductorChoices.should_use_persistent_reduction = staticmethod(rule)
runpy.run_path(os.path.join(os.path.dirname(__file__), "bench_moe_block.py"), run_name="__main__")
