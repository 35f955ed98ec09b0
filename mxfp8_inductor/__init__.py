"""mxfp8-inductor: MXFP8 training for Mixture-of-Experts grouped GEMMs through torch.compile.

Ways in: `torch.compile(model, backend="mxfp8", options={...})`,
`torch.compile(model, options=inductor_options(...))`, `mxfp8(model, ...)` then a plain
`torch.compile`, and `explain(model, *args)` for the per-site report and rewritten graphs.
"""

from ._version import __version__, check_torch

check_torch()

from .backend import inductor_options, mxfp8_backend, register_backend_name  # noqa: E402
from .explain import Report, explain  # noqa: E402
from .kernels.mx import (  # noqa: E402
    dequantize,
    dequantize_groups,
    quantize,
    quantize_groups,
    to_blocked,
    to_blocked_groups,
)
from .lowering import clear_weight_cache, grouped_mm, linear  # noqa: E402
from .marking import mxfp8  # noqa: E402
from .options import MXFP8Config  # noqa: E402

register_backend_name()

__all__ = [
    "__version__",
    "MXFP8Config",
    "Report",
    "clear_weight_cache",
    "dequantize",
    "dequantize_groups",
    "explain",
    "grouped_mm",
    "inductor_options",
    "linear",
    "mxfp8",
    "mxfp8_backend",
    "quantize",
    "quantize_groups",
    "to_blocked",
    "to_blocked_groups",
]
