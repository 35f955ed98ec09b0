"""TorchTitan model converter: `MXFP8InductorConverter` marks the model that TorchTitan builds
with `mxfp8_inductor.mxfp8`, so the compile TorchTitan already applies (backend "inductor", per
transformer block) rewrites the routed experts' grouped GEMMs.

TorchTitan 0.3.0 converters transform the model *config* before the model is built, and are
listed in a config_registry function (`model_registry(flavor, converters=[...])`), which
`--module <python module> --config <function>` selects on the command line::

    def deepseek_v3_16b_mxfp8() -> Trainer.Config:
        config = deepseek_v3_16b()
        config.model_spec = model_registry("16B", converters=[MXFP8InductorConverter.Config(
            exclude=["layers.0.*"], model_compile_enabled=True)])
        return config

Importing this module imports torchtitan; importing `mxfp8_inductor` does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.config import Configurable
from torchtitan.tools.logging import logger

from .marking import mxfp8
from .options import MXFP8Config, Recipe, Rounding, Wgrad

_MARKING_CONFIGS: dict[type, type] = {}


def _marking_config_class(base: type) -> type:
    """A subclass of the root model config `base` with an `mxfp8` field, whose `build()` marks
    the model it builds. Marking the root, not each experts config, keeps include/exclude
    patterns on global FQNs ("layers.3.moe.experts"), also under TorchTitan's per-block compile."""
    if base not in _MARKING_CONFIGS:

        @dataclasses.dataclass(kw_only=True, slots=True)
        class MarkingConfig(base):
            mxfp8: MXFP8Config = dataclasses.field(default_factory=MXFP8Config)

            def build(self, **kwargs: Any) -> torch.nn.Module:
                # slots=True dataclasses cannot use zero-argument super()
                return mxfp8(base.build(self, **kwargs), self.mxfp8)

        MarkingConfig.__name__ = MarkingConfig.__qualname__ = f"MXFP8{base.__qualname__.replace('.', '')}"
        _MARKING_CONFIGS[base] = MarkingConfig
    return _MARKING_CONFIGS[base]


class MXFP8InductorConverter(QuantizationConverter):
    """Rewrite the routed experts' grouped GEMMs into MXFP8 (or FP8 rowwise) ops through
    torch.compile, with the options of `mxfp8_inductor.MXFP8Config`.

    `convert()` returns the root model config wrapped so that the model it builds is marked
    with `mxfp8_inductor.mxfp8`. Compile the model with TorchTitan's default backend
    ("inductor"): the pass runs inside Inductor, next to FlexAttention's lowering.
    """

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        include: list[str] = dataclasses.field(default_factory=list)
        """Glob patterns over global module or parameter FQNs to rewrite; empty: every routed expert."""

        exclude: list[str] = dataclasses.field(default_factory=list)
        """Glob patterns whose sites stay in bf16 (wins over include), e.g. "layers.0.*"."""

        recipe: Recipe = MXFP8Config.recipe
        """One of `mxfp8_inductor.options.RECIPES`, as for `MXFP8Config`."""

        rounding: Rounding = MXFP8Config.rounding
        """The scale exponent rule, one of `mxfp8_inductor.options.ROUNDINGS`."""

        wgrad: Wgrad = MXFP8Config.wgrad
        """The weight gradient, one of `mxfp8_inductor.options.WGRADS`: the recipe's, or bf16."""

        weight_cache: bool = MXFP8Config.weight_cache
        """Reuse each weight's FP8 operands until its parameter changes or an optimizer steps (off by
        default: it holds them for the whole model until the step)."""

        autotune: bool = MXFP8Config.autotune
        """With recipe "auto", time each GEMM's candidates on the GPU (once per shape and machine);
        False: the H200 cost model."""

        fsdp_fp8_all_gather: bool = MXFP8Config.fsdp_fp8_all_gather
        """Under FSDP2, all-gather expert weights in FP8, each rounded once for both of its GEMMs
        (recipe mxfp8 or fp8_rowwise; docs/design.md, "FSDP2: FP8 all-gather")."""

    def __init__(self, config: Config) -> None:
        self.config = config
        # raises ValueError naming a bad option value and the valid ones
        self.options = MXFP8Config(include=tuple(config.include), exclude=tuple(config.exclude),
                                   recipe=config.recipe, rounding=config.rounding, wgrad=config.wgrad,
                                   weight_cache=config.weight_cache, autotune=config.autotune,
                                   fsdp_fp8_all_gather=config.fsdp_fp8_all_gather)
        if not config.model_compile_enabled:
            logger.warning("mxfp8_inductor rewrites grouped GEMMs inside torch.compile only: without "
                           "--compile.enable (and 'model' in --compile.components) the experts stay in bf16")

    def convert(self, model_config: Configurable.Config) -> Configurable.Config:
        """The root model config, wrapped so that `build()` marks the model with these options."""
        if type(model_config) in _MARKING_CONFIGS.values():
            raise ValueError("MXFP8InductorConverter is listed twice in converters: list it once")
        cls = _marking_config_class(type(model_config))
        fields = {f.name: getattr(model_config, f.name) for f in dataclasses.fields(model_config) if f.init}
        logger.info(f"mxfp8_inductor: marking {type(model_config).__qualname__} with {self.options}")
        return cls(**fields, mxfp8=self.options)
