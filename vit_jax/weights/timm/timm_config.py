"""What a timm directory's config.json says that its weights cannot show:
the activation, the LayerNorm epsilon, a NaFlexViT's resizing of its
position table, DINOv3's pooling and RoPE base, the RoPE form and pooling
of the other Eva families, a VisionTransformer's pooling (`model_args`
over the defaults of the model function it names, `architecture`);
registered as a reader of `origins.CONFIG_READERS`.
"""

from vit_jax.errors import WeightsError
from vit_jax.weights import origins
from vit_jax.weights import unsupported
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
  if "_clip_" in config[
      "architecture"] and not config["architecture"].startswith("eva"):
    options["layer_norm_eps"] = 1e-5  # timm's CLIP functions' LayerNorm.
  if "_quickgelu_" in config["architecture"] and "act_layer" not in args:
    options["quick_gelu"] = True  # e.g. vit_base_patch16_clip_quickgelu_224.
  if "_dinov3" in config["architecture"]:  # Its pooling and RoPE's base.
    pool = args.get("global_pool", config.get("global_pool", "avg"))
    options["classifier"] = "token" if pool == "token" else "gap"
    options["rope_temperature"] = float(args.get("rope_temperature", 100.0))
  if "_dinov3" in config["architecture"] or any(
      part in config["architecture"] for part in _EVA_FUNCTIONS):
    options.update(_eva_options(args))  # What model_args say of RoPE.
  elif args.get("global_pool") in POOLS:  # A VisionTransformer's pooling.
    options["classifier"] = POOLS[args["global_pool"]]
  return options


# timm's Eva functions whose family (weights/timm/eva.py) the file says;
# model_args may change what the family's functions set.
_EVA_FUNCTIONS = ("eva02_", "_rope_", "vit_pe_core_")
# timm's model_args -> config.model (timm_dir and eva_export write back).
POOLS = {"avg": "gap", "token": "token", "map": "map"}  # global_pool
ROPE_TYPES = {"dinov3": "dinov3", "cat": "axial", "mixed": "mixed"}


def _eva_options(args: dict) -> dict:
  """The config.model fields of an Eva model's model_args: RoPE's kind,
  base, layout, axis order, offset and reference grid, the pooling, PE's
  pool's heads."""
  options = {}
  if args.get("rope_type") in ROPE_TYPES:
    options["rope"] = ROPE_TYPES[args["rope_type"]]
  if "rope_temperature" in args:
    options["rope_temperature"] = float(args["rope_temperature"])
  if "rope_rotate_half" in args:
    options["rope_layout"] = ("half"
                              if args["rope_rotate_half"] else "interleaved")
  if "rope_grid_indexing" in args:
    options["rope_axes"] = ("column_row" if args["rope_grid_indexing"] == "xy"
                            else "row_column")
  if "rope_grid_offset" in args:
    options["rope_grid_offset"] = float(args["rope_grid_offset"])
  if "ref_feat_shape" in args:
    reference = args["ref_feat_shape"] or [0, 0]  # None: none.
    reference = reference if isinstance(reference,
                                        (list,
                                         tuple)) else [reference, reference]
    if reference[0] != reference[1]:
      raise WeightsError(
          f"RoPE's reference grid {tuple(reference)} (model_args "
          "ref_feat_shape) is not square; this project scales both axes to "
          "one side (config.model.rope_reference_grid).")
    options["rope_reference_grid"] = int(reference[0])
  if args.get("global_pool") in POOLS:
    options["classifier"] = POOLS[args["global_pool"]]
  if "attn_pool_num_heads" in args:
    options["map_heads"] = int(args["attn_pool_num_heads"])
  return options


def _unsupported(config: dict):
  return unsupported.for_architecture(config["architecture"])


origins.register_config_reader(
    "timm",
    origins.ConfigReader(claims=is_timm_config, rank=10,
                         stated_options=stated_options,
                         unsupported=_unsupported, heads=lambda config: 0))
