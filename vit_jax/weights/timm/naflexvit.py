"""timm's NaFlexViT (`timm/models/naflexvit.py`) <-> this project's ViT.

A NaFlexViT's state dict is a timm ViT's (blocks, norm, fc_norm, attn_pool,
head) with its embeddings under `embeds.`:

  embeds.proj.weight    D x (P*P*C), a Linear over flattened patches in
                        (row, column, channel) order: our conv kernel
                        (P, P, C, D), reshaped and transposed
  embeds.pos_embed      1 x H x W x D, for the patches only (never the
                        class token or registers)
  embeds.pos_embed_y/x  1 x H x D and 1 x W x D: factorized
  embeds.cls_token, embeds.reg_token

What the weights cannot show is read from the model function a timm
directory's config.json names (`model_args` over the function's defaults):
how the table is resized (`pos_embed_interp_mode`: bicubic by default,
bilinear for the SigLIP 2 ports), whether to a square of the longer side
(`pos_embed_ar_preserving`) and the activation. A bare file takes the
defaults of timm's NaFlexViT functions: a MAP head without registers is a
SigLIP 2 port (tanh GELU, bilinear), anything else exact GELU and bicubic.
"""

import numpy as np

from vit_jax.errors import WeightsError

PREFIX = "embeds."
_FACTORIZED = ("Transformer/posembed_input/pos_embedding_y",
               "Transformer/posembed_input/pos_embedding_x")
# timm's NaFlexViT model functions (with sizes of their own in model_args).
_FUNCTIONS = {
    ("learned", "avg", False): "naflexvit_base_patch16_gap",
    ("learned", "avg", True): "naflexvit_base_patch16_par_gap",
    ("factorized", "avg", True): "naflexvit_base_patch16_parfac_gap",
    ("learned", "map", False): "naflexvit_base_patch16_siglip",
}


def is_naflex(names) -> bool:
  return any(name.startswith(PREFIX) for name in names)


def to_timm_vit(tensors: dict) -> tuple[dict, dict]:
  """(the state dict under timm ViT's names, our factorized tables)."""
  out, factorized = {}, {}
  for name, value in tensors.items():
    if not name.startswith(PREFIX):
      out[name] = value
      continue
    short = name[len(PREFIX):]
    if short == "proj.weight":  # D x (P*P*C) -> D x C x P x P (a conv's).
      width, features = value.shape
      patch = int(round((features / 3)**0.5))
      if patch * patch * 3 != features:
        raise WeightsError(f"{name} embeds {features} values per patch, not "
                           "P x P x 3 pixels.")
      out["patch_embed.proj.weight"] = value.reshape(width, patch, patch,
                                                     3).transpose(0, 3, 1, 2)
    elif short == "proj.bias":
      out["patch_embed.proj.bias"] = value
    elif short == "pos_embed":  # 1 x H x W x D, the patches only.
      out["pos_embed"] = value.reshape(1, -1, value.shape[-1])
    elif short in ("pos_embed_y", "pos_embed_x"):
      factorized[_FACTORIZED[short.endswith("x")]] = value
    elif short in ("cls_token", "reg_token"):
      out[short] = value
    else:
      raise WeightsError(f"{name}: a NaFlexViT embedding this project does "
                         "not have (a norm before or after the projection?).")
  return out, factorized


def options(tensors: dict, model_args: dict = None) -> dict:
  """The `config.model` options a NaFlexViT's file (and its directory's
  model_args and function) say: see the module doc."""
  args = dict(model_args or {})
  siglip = "attn_pool.latent" in tensors and "embeds.reg_token" not in tensors
  interpolation = args.get("pos_embed_interp_mode",
                           "bilinear" if siglip else "bicubic")
  if interpolation not in ("bilinear", "bicubic"):
    raise WeightsError(f"timm's pos_embed_interp_mode={interpolation!r}: this "
                       "project resizes position tables bilinearly or "
                       "bicubically (antialiased).")
  found = {
      "posemb_interpolation": interpolation,
      "posemb_keep_aspect": bool(args.get("pos_embed_ar_preserving", False)),
  }
  if "act_layer" not in args:
    found["gelu_approximate"] = siglip
  if any(n.startswith("embeds.pos_embed_") for n in tensors):
    found["posemb"] = "factorized"
  return found


def function_options(architecture: str) -> dict:
  """model_args a NaFlexViT function sets itself (for a directory's
  config.json that names it and overrides only sizes)."""
  defaults = {
      "naflexvit_base_patch16_par_gap": dict(pos_embed_ar_preserving=True),
      "naflexvit_base_patch16_parfac_gap": dict(pos_embed_ar_preserving=True),
      "naflexvit_base_patch16_siglip": dict(pos_embed_interp_mode="bilinear",
                                            act_layer="gelu_tanh"),
      "naflexvit_so400m_patch16_siglip": dict(pos_embed_interp_mode="bilinear",
                                              act_layer="gelu_tanh"),
  }
  for name, args in defaults.items():
    if architecture.startswith(name):
      return dict(args)
  return {}


def from_ours(state: dict, params: dict) -> dict:
  """A timm ViT state dict (`timm_names.to_timm`) of one of our models as a
  NaFlexViT's: the embeddings under `embeds.` (the inverse of
  `to_timm_vit`)."""
  out = {}
  for name, value in state.items():
    if name == "patch_embed.proj.weight":  # D x C x P x P -> D x (P*P*C).
      out["embeds.proj.weight"] = value.transpose(0, 2, 3, 1).reshape(
          value.shape[0], -1)
    elif name == "patch_embed.proj.bias":
      out["embeds.proj.bias"] = value
    elif name == "pos_embed":
      side = int(round(value.shape[1]**0.5))
      out["embeds.pos_embed"] = value.reshape(1, side, side, value.shape[-1])
    elif name in ("cls_token", "reg_token"):
      out[f"embeds.{name}"] = value
    else:
      out[name] = value
  for ours, short in zip(_FACTORIZED, ("pos_embed_y", "pos_embed_x")):
    if ours in params:
      out[f"embeds.{short}"] = np.asarray(params[ours], np.float32)
  return out


def function_for(posemb: str, pool: str, keep_aspect: bool) -> str:
  """The timm NaFlexViT function whose defaults come closest (model_args
  say the rest)."""
  key = ("factorized" if posemb == "factorized" else "learned", pool,
         keep_aspect)
  if key not in _FUNCTIONS:
    aspect = " and aspect-preserving resizing" if keep_aspect else ""
    raise WeightsError(
        f"timm has no NaFlexViT function with {key[0]} position embeddings, "
        f"{pool} pooling{aspect}; use --format=npz.")
  return _FUNCTIONS[key]
