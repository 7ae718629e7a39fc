"""What a timm directory's config.json says that its weights cannot show:
the activation, the LayerNorm epsilon, a NaFlexViT's resizing of its
position table, DINOv3's pooling and RoPE base (`model_args` over the
defaults of the model function it names, `architecture`).
"""

from vit_jax.weights.timm import naflexvit
from vit_jax.weights.torch_layout import ACTIVATIONS


def is_timm_config(config: dict) -> bool:
  return "architecture" in config


def stated_options(config: dict) -> dict:
  """The `config.model` fields a timm config.json states."""
  args = config.get("model_args", {})
  naflex = config["architecture"].startswith("naflexvit")
  if naflex:  # What its function sets, then model_args over it.
    args = {**naflexvit.function_options(config["architecture"]), **args}
  options = dict(ACTIVATIONS.get(args.get("act_layer", "gelu"), {}))
  if naflex:
    options["posemb_interpolation"] = args.get("pos_embed_interp_mode",
                                               "bicubic")
    options["posemb_keep_aspect"] = bool(
        args.get("pos_embed_ar_preserving", False))
  if "_clip_" in config["architecture"]:
    options["layer_norm_eps"] = 1e-5  # timm's CLIP functions' LayerNorm.
  if "_quickgelu_" in config["architecture"] and "act_layer" not in args:
    options["quick_gelu"] = True  # e.g. vit_base_patch16_clip_quickgelu_224.
  if "_dinov3" in config["architecture"]:  # Its pooling and RoPE's base.
    pool = args.get("global_pool", config.get("global_pool", "avg"))
    options["classifier"] = "token" if pool == "token" else "gap"
    options["rope_temperature"] = float(args.get("rope_temperature", 100.0))
  return options
