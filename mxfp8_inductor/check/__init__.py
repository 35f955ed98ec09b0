"""Does the pass add error of its own on a model? Model-level equivalence with the op.

    python -m mxfp8_inductor.check gpt_oss                    # a transformers model type, tiny
    python -m mxfp8_inductor.check Qwen/Qwen3-30B-A3B         # a Hub id or folder with config.json
    python -m mxfp8_inductor.check my_pkg.models:build        # build() -> (model, inputs)

One forward and backward (loss: mean of the output squared) from the same weights, four ways:
  pass       torch.compile with the pass (backend="mxfp8" and the options)
  op         eager, with every grouped matmul the pass would rewrite replaced by
             `mxfp8_inductor.grouped_mm` at the same call site (and with targets="all" every
             linear by `mxfp8_inductor.linear`)
  bf16 compiled, bf16 eager
For the output and every parameter gradient the bar is
  SQNR(bf16 compiled, pass) >= SQNR(bf16 eager, op) - 2 dB:
the pass adds no error beyond MXFP8's own. Why the compiled runs emulate eager's bf16 rounding:
docs/design.md, "Model-level equivalence".
"""

from .harness import BAR_DB, Comparison, OpAtSites, Row, compare
from .metrics import sqnr
from .zoo import TINY, text_config, tiny_config, transformers_families, transformers_model

__all__ = ["BAR_DB", "TINY", "Comparison", "OpAtSites", "Row", "compare", "sqnr", "text_config", "tiny_config",
           "transformers_families", "transformers_model"]
