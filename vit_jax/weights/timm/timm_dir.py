"""A directory that timm builds the model from, offline:

    model = timm.create_model("local-dir:DIR", pretrained=True)

as timm's own `save_for_hf` writes it (and the Hub serves it):
`config.json` names a timm model function (`architecture`), the constructor
arguments that make it this model (`model_args`: sizes, class token,
pooling, registers, LayerScale, pre-norm, fc_norm, activation, qkv_bias,
qk_norm, ...), the classes (`num_classes`, `label_names`) and the
evaluation preprocessing (`pretrained_cfg`); `model.safetensors` holds the
state dict.

The architecture is chosen for what `model_args` cannot say: the LayerNorm
epsilon (timm's ViT functions use 1e-6, its CLIP ones 1e-5). Fixed sincos2d
position embeddings are written as the table of their values at the
export's resolution (the same model there; timm would train the table), and
a pre-norm model's patch-embedding bias (timm's has none) is added into the
patches' position embeddings (the same sum). `save_timm` writes the state
dict alone (`vit-jax export --format=timm`).
"""

import json

import flax
import numpy as np

from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.weights import architecture
from vit_jax.weights import eval_preprocessing
from vit_jax.weights import exports
from vit_jax.weights import families
from vit_jax.weights import mixer_layout
from vit_jax.weights import writers
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import is_pretraining_part
from vit_jax.weights.names import posemb_prefix
from vit_jax.weights.timm import eva_export
from vit_jax.weights.timm import naflexvit
from vit_jax.weights.timm import timm_mixer
from vit_jax.weights.timm import timm_names

# timm model function -> the LayerNorm epsilon it builds its ViT with.
_VIT_BY_EPS = {1e-6: "vit_base_patch16_224", 1e-5: "vit_base_patch16_clip_224"}
# timm's Mixer functions fix (patch, blocks, width); the rest are arguments.
# Their LayerNorm epsilon is 1e-6, as ours.
_MIXERS = {
    (patch, blocks, width): f"mixer_{size}{patch}_224"
    for size, blocks, width in (("s", 8, 512), ("b", 12, 768), ("l", 24, 1024))
    for patch in (16, 32)
}


def write(directory: str, params: dict, model_config, image_size: int,
          pp: eval_preprocessing.EvalPreprocessing, class_names=None,
          naflex: bool = False):
  """Writes `config.json` and `model.safetensors` into `directory`.

  `params`: flat, our names, position embeddings as the model holds them;
  `model_config`: the config.model that built it (GELU decided); `naflex`:
  a model of images at their own shape, written as timm's NaFlexViT."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  mixer = mixer_layout.is_mixer(params)
  writer = exports.writer("timm-dir", model_config, mixer, naflex)
  if writer != "timm-eva":  # eva_export checks its own.
    exports.refuse_unwritten(model_config, writer, mixer, naflex)
  if writer == "timm-mixer":
    architecture, model_args = _mixer_args(params, model_config)
    state, first_conv = timm_mixer.to_timm_mixer(params), "stem.proj"
  elif writer == "timm-naflex":
    architecture, model_args, state = _naflex(params, model_config, image_size)
    first_conv = "embeds.proj"
  elif writer == "timm-eva":
    architecture, model_args = eva_export.args(params, model_config, image_size)
    state, first_conv = eva_export.state(params), "patch_embed.proj"
  else:
    architecture, model_args, params = _vit_args(params, model_config,
                                                 image_size)
    state, first_conv = timm_names.to_timm(params, True), "patch_embed.proj"
  num_classes = model_args["num_classes"]
  width = params["embedding/kernel" if "embedding/kernel" in
                 params else "stem/kernel"].shape[-1]
  config = {
      "architecture": architecture,
      "num_classes": num_classes,
      "num_features": width,
      "global_pool": model_args["global_pool"],
      "model_args": model_args,
      "pretrained_cfg": _pretrained_cfg(pp, num_classes, first_conv),
  }
  if class_names:
    config["label_names"] = list(class_names)
  out = paths.resolve(directory)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  (out / "model.safetensors").write_bytes(
      st_numpy.save(state, metadata={"format": "pt"}))


def _activation(model_config) -> str:
  if model_config.quick_gelu:
    return "quick_gelu"
  return "gelu_tanh" if model_config.gelu_approximate else "gelu"


def _vit_args(params, model_config, image_size) -> tuple[str, dict, dict]:
  """(timm model function, its model_args, params with a position
  embedding table) of a ViT."""
  if POSEMB + "_y" in params:
    raise WeightsError(
        "timm's VisionTransformer has no factorized position embeddings "
        "(NaViT's, config.model.posemb=factorized); its NaFlexViT has, for a "
        "model of images at their own shape (config.sequence_length): use "
        "--format=npz.")
  eps = model_config.layer_norm_eps
  if eps not in _VIT_BY_EPS:
    raise WeightsError(
        f"timm's ViT functions build LayerNorms with epsilon 1e-6 or 1e-5, "
        f"not config.model.layer_norm_eps={eps}; use --format=npz.")
  variant = architecture.variant_of(params, "the model")
  width, mlp, patch = variant.hidden_size, variant.mlp_dim, variant.patch_size
  classifier = model_config.classifier
  if classifier == "map" and (eps != 1e-6 or _activation(model_config)
                              not in ("gelu", "gelu_tanh")):
    raise WeightsError(
        "timm's attention pool shares the blocks' LayerNorm and activation; "
        "this model's MAP head does not; use --format=npz.")
  prefix = int("cls" in params) + (params["registers"].shape[1]
                                   if "registers" in params else 0)
  table_prefix = (
      posemb_prefix(params) if POSEMB in params else 0)  # sincos2d: patches.
  params = writers.with_posemb_table(params, image_size, model_config.posemb)
  grid_tokens = params[POSEMB].shape[1] - table_prefix
  if "Transformer/pre_norm/scale" in params:
    # timm's pre-norm patch embedding has no bias: it goes into the patches'
    # position embeddings, to which it is added all the same.
    table = np.array(params[POSEMB], np.float32)
    table[:, table_prefix:] += params.pop("embedding/bias")
    params[POSEMB] = table
  head = params.get("head/kernel")
  layer_scale = any(k.endswith("/LayerScale_attention/scale") for k in params)
  block = families.block_options(params)
  args = {
      "img_size": round(grid_tokens**0.5) * patch,
      "patch_size": patch,
      "embed_dim": width,
      "depth": variant.num_layers,
      "num_heads": variant.num_heads,
      "mlp_ratio": mlp / width,
      "qkv_bias": block["qkv_bias"],
      "class_token": "cls" in params,
      "reg_tokens": prefix - int("cls" in params),
      "no_embed_class": bool(prefix) and table_prefix == 0,
      "global_pool": eva_export.POOLS[classifier],
      "fc_norm": "pooled_norm/scale" in params,
      "pre_norm": "Transformer/pre_norm/scale" in params,
      "init_values": (
          model_config.layer_scale or 1e-5 if layer_scale else None),
      "act_layer": _activation(model_config),
      "num_classes": 0 if head is None else head.shape[-1],
  }
  if block["qk_norm"]:
    args["qk_norm"] = True
  if int(width * args["mlp_ratio"]) != mlp:
    raise WeightsError(f"timm cannot build an MLP of {mlp} units on a width "
                       f"of {width} (mlp_ratio); use --format=npz.")
  return _VIT_BY_EPS[eps], args, params


def _naflex(params, model_config, image_size) -> tuple[str, dict, dict]:
  """(timm's NaFlexViT function, its model_args, the state dict): a ViT's
  arguments and names (`_vit_args`, `timm_names.to_timm`), the embeddings
  moved under `embeds.` (`naflexvit.from_ours`)."""
  factorized = POSEMB + "_y" in params
  vit_params = dict(params)
  if factorized:  # A learned table's place, which NaFlexViT's file drops.
    rows = vit_params.pop(POSEMB + "_y")
    cols = vit_params.pop(POSEMB + "_x")
    vit_params[POSEMB] = np.zeros(
        (1, rows.shape[1] * cols.shape[1], rows.shape[-1]), np.float32)
  elif POSEMB in params and posemb_prefix(params):
    raise WeightsError("timm's NaFlexViT gives the class token and registers "
                       "no position embedding; this model's table has "
                       "theirs. Use --format=npz.")
  _, args, vit_params = _vit_args(vit_params, model_config, image_size)
  if args.pop("pre_norm"):
    raise WeightsError("A pre-norm (CLIP) model is not a NaFlexViT; use "
                       "--format=npz.")
  args.pop("no_embed_class")
  keep_aspect = bool(model_config.posemb_keep_aspect)
  side = args["img_size"] // args["patch_size"]
  args.update(
      pos_embed="factorized" if factorized else "learned", pos_embed_grid_size=[
          side, side
      ], pos_embed_interp_mode=model_config.posemb_interpolation or "bilinear",
      pos_embed_ar_preserving=keep_aspect)
  function = naflexvit.function_for("factorized" if factorized else "learned",
                                    args["global_pool"], keep_aspect)
  state = naflexvit.from_ours(timm_names.to_timm(vit_params, True), params)
  if factorized:
    state.pop("embeds.pos_embed")
  return function, args, state


def _mixer_args(params, model_config) -> tuple[str, dict]:
  if model_config.gelu_approximate:
    raise WeightsError(
        "This Mixer computes the tanh GELU (the released weights' form) and "
        "timm's MlpMixer config cannot say so (its act_layer is a class): "
        "use --format=timm and build timm's model with "
        "act_layer=timm.layers.GELUTanh, or fine-tune with "
        "config.model.gelu_approximate=False.")
  arch = mixer_layout.mixer_architecture(params)
  if arch.representation_size or arch.image_size is None:
    raise WeightsError("timm's MlpMixer has no pre-logits layer and needs a "
                       "square token grid; use --format=npz.")
  size = (arch.patch_size, arch.num_layers, arch.hidden_size)
  if size not in _MIXERS:
    raise WeightsError(
        f"timm has no Mixer function of patch {size[0]}, {size[1]} blocks "
        f"and width {size[2]} (it has S, B and L at /16 and /32): use "
        "--format=timm (its state dict, for timm.models.MlpMixer built "
        "in code) or --format=npz.")
  ratios = [
      arch.tokens_mlp_dim / arch.hidden_size,
      arch.channels_mlp_dim / arch.hidden_size
  ]
  if [int(arch.hidden_size * r) for r in ratios] != [
      arch.tokens_mlp_dim, arch.channels_mlp_dim
  ]:
    raise WeightsError("timm cannot build these MLP widths from mlp_ratio; "
                       "use --format=npz.")
  return _MIXERS[size], {
      "img_size": arch.image_size,
      "mlp_ratio": ratios,
      "global_pool": "avg",
      "num_classes": arch.num_classes or 0,
  }


def _pretrained_cfg(pp: eval_preprocessing.EvalPreprocessing, num_classes: int,
                    first_conv: str) -> dict:
  """timm's evaluation transforms: `squash` resizes both sides to
  image_size / crop_pct, `center` the shorter one; then the central crop."""
  size = pp.image_size
  return {
      "input_size": [3, size, size],
      "fixed_input_size": True,
      "interpolation": "bilinear",
      "crop_pct": pp.crop_fraction,
      "crop_mode": "center" if pp.keep_aspect else "squash",
      "mean": list(pp.mean),
      "std": list(pp.std),
      "num_classes": num_classes,
      "first_conv": first_conv,
      "classifier": "head",
  }


def save_timm(params, path: str) -> list[str]:
  """Params (flat or nested) -> timm VisionTransformer state dict. Returns
  what was left out: the parts of masked patch prediction and MAE's
  decoder, which timm's model has no place for (its features are the same
  without them)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  if not all(isinstance(k, str) and "/" in k for k in params):
    params = flax.traverse_util.flatten_dict(params, sep="/")
  left_out = sorted(k for k in params if is_pretraining_part(k))
  flat = {
      k: np.asarray(v, np.float32)
      for k, v in params.items()
      if k not in left_out
  }
  to_timm = (timm_mixer.to_timm_mixer
             if mixer_layout.is_mixer(flat) else timm_names.to_timm)
  paths.resolve(path).write_bytes(st_numpy.save(to_timm(flat)))
  return left_out
