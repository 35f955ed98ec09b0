"""Test models: one tiny random-init model per transformers MoE family, and the loaders the CLI
and the examples share."""

from __future__ import annotations

import pathlib
from typing import Any

import torch

TINY = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 16, "max_position_embeddings": 64, "num_experts": 8,
    "num_local_experts": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 0,
    "n_group": 1, "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16, "v_head_dim": 16, "decoder_sparse_step": 1, "sliding_window": 16,
}


def transformers_families() -> list[str]:
    """One model type per transformers family whose experts take the `grouped_mm` implementation
    (its modeling module decorates them with `use_experts_implementation`): the family's causal
    LM if it has one, else its base model."""
    import transformers
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    root = pathlib.Path(transformers.__file__).parent / "models"
    folders = {p.parent.name for p in root.glob("*/modeling_*.py") if "@use_experts_implementation" in p.read_text()}
    by_folder: dict[str, str] = {}
    towers = ("vision", "audio", "encoder")
    for heads in (modeling_auto.MODEL_MAPPING_NAMES, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        for t in CONFIG_MAPPING_NAMES:
            if t in heads and model_type_to_module_name(t) in folders and not any(w in t for w in towers):
                by_folder[model_type_to_module_name(t)] = t
    return sorted(by_folder.values())


def tiny_config(config: Any, overrides: dict[str, Any] = TINY) -> Any:
    """`config` rebuilt by its own class with its size knobs set to `overrides` (where it has the
    knob, as an int), its per-layer lists cut to the new depth and token ids kept in the vocabulary."""
    values = config.to_dict()
    for derived in ("model_type", "transformers_version", "architectures"):
        values.pop(derived, None)
    depth, layers = values.get("num_hidden_layers"), overrides["num_hidden_layers"]
    for key, value in list(values.items()):
        if key in overrides and (value is None or isinstance(value, int) and not isinstance(value, bool)):
            values[key] = overrides[key]
        elif isinstance(value, list) and depth and len(value) == depth:
            values[key] = value[:layers]
        elif isinstance(value, dict) and depth and value and all(str(k).isdigit() for k in value):
            values[key] = {k: v for k, v in value.items() if int(k) < layers}
    for key, value in values.items():
        if key.endswith("_token_id") and isinstance(value, int) and value >= overrides["vocab_size"]:
            values[key] = 0
    if "use_cache" in values:  # a training step: no generation cache (hybrid models need attention layers for one)
        values["use_cache"] = False
    return type(config)(**values)


def text_config(name: str):
    """The text-model config of a transformers model type, Hub id or config folder."""
    import transformers

    if name in transformers.CONFIG_MAPPING:
        config = transformers.CONFIG_MAPPING[name]()
    else:
        config = transformers.AutoConfig.from_pretrained(name)
    return config.get_text_config()


def transformers_model(
    name: str, tiny: bool = True, layers: int = TINY["num_hidden_layers"], full_attention: bool = False
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A causal LM (or base model) of a model type, Hub id or config folder, random init, with
    2 x 16 token ids as input; `tiny`: at the `TINY` sizes, `layers` deep. `full_attention`: a
    hybrid stack's linear-attention layers become full attention where its config lists the
    layers' kinds (their reference implementations, loops over each chunk's tokens, take minutes
    to trace; the pass never rewrites them)."""
    return model_from_config(text_config(name), tiny, layers, full_attention)


def model_from_config(
    config: Any, tiny: bool = True, layers: int = TINY["num_hidden_layers"], full_attention: bool = False
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """`transformers_model` of a text-model config already loaded (the CLI loads it apart, so that
    a config it cannot load is the user's mistake, not a failure of building)."""
    import transformers

    # a stack that lists its layers' kinds, settable (Jamba derives its list from attention periods)
    listed = not isinstance(getattr(type(config), "layer_types", None), property)
    hybrid = listed and "full_attention" in (getattr(config, "layer_types", None) or [])
    if tiny:
        config = tiny_config(config, {**TINY, "num_hidden_layers": layers})
    if full_attention and hybrid:
        config.layer_types = ["full_attention" if k == "linear_attention" else k for k in config.layer_types]
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    except ValueError:  # no causal-LM head registered for this type
        model = transformers.AutoModel.from_config(config)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    return model, (ids,)
