"""A RoPE model written as timm's `Eva` (timm/models/eva.py), which builds
every RoPE family here: the model function and `model_args` of its
config.json, and its state dict in Eva's names (`eva.py` reads them back).

timm builds a directory's model as `create_model(architecture,
**model_args)`, and model_args override what the function sets, so one
function per LayerNorm epsilon (which model_args cannot carry: Eva takes
it in `norm_layer`) serves every form: EVA-02's (1e-6), DINOv3's and PE's
(1e-5); model_args state every option of the form.
"""

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.weights import architecture
from vit_jax.weights import exports
from vit_jax.weights import families
from vit_jax.weights import torch_layout
from vit_jax.weights.names import POSEMB
from vit_jax.weights.timm import attention_pool
from vit_jax.weights.timm import eva
from vit_jax.weights.timm import timm_config
from vit_jax.weights.timm import timm_names

POOLS = {ours: theirs for theirs, ours in timm_config.POOLS.items()}
_ROPE_TYPES = {ours: theirs for theirs, ours in timm_config.ROPE_TYPES.items()}


def _function(model_config, block) -> str:
  """The function whose defaults model_args override: its LayerNorm
  epsilon is the one thing they cannot."""
  if model_config.layer_norm_eps == 1e-6:
    return "eva02_tiny_patch14_224"
  if model_config.rope == "dinov3":
    return ("vit_small_patch16_dinov3_qkvb"
            if block["qkv_bias"] else "vit_small_patch16_dinov3")
  return "vit_pe_core_tiny_patch16_384"


def _refuse_what_eva_lacks(params, model_config, block):
  """One line naming what timm's Eva cannot build from model_args: a
  field it does not write (`exports`: timm-eva), or a value or parameter
  of one it writes."""
  exports.refuse_unwritten(model_config, "timm-eva")
  form = model_config
  embedding_bias = params.get("embedding/bias")
  differs = {
      "a position table other than learned": form.posemb not in
                                             ("learn", "none"),
      "tanh GELU (Eva's are erf)": (
          form.gelu_approximate and
          (not block["swiglu"] or form.classifier == "map")),
      "a LayerNorm epsilon other than 1e-6 or 1e-5": form.layer_norm_eps not in
                                                     (1e-6, 1e-5),
      "a patch embedding bias with the LayerNorm before the blocks (Eva's "
      "has none there)": "Transformer/pre_norm/scale" in params
                         and embedding_bias is not None
                         and bool(np.any(embedding_bias)),
      "RoPE-Mixed in the half layout or with an offset or reference grid":
          form.rope == "mixed" and
          (form.rope_layout == "half" or form.rope_grid_offset or
           form.rope_reference_grid),
      "a hybrid's ResNet stem": any(k.startswith("conv_root") for k in params),
  }
  wrong = [what for what, found in differs.items() if found]
  if wrong:
    raise WeightsError(
        "timm writes RoPE models as its Eva, which this model does not fit: "
        f"it has {', '.join(wrong)}; use --format=npz.")


def args(params, model_config, image_size: int) -> tuple[str, dict]:
  """(timm's model function, its model_args) of a RoPE model."""
  block = families.block_options(params)
  _refuse_what_eva_lacks(params, model_config, block)
  form = model_config
  variant = architecture.variant_of(params, "the model")
  width, mlp = variant.hidden_size, variant.mlp_dim
  if int(width * (mlp / width)) != mlp:
    raise WeightsError(f"timm cannot build an MLP of {mlp} units on a width "
                       f"of {width} (mlp_ratio); use --format=npz.")
  head = params.get("head/kernel")
  layer_scale = any(k.endswith("/LayerScale_attention/scale") for k in params)
  reference = form.rope_reference_grid
  model_args = {
      "img_size": image_size,
      "patch_size": variant.patch_size,
      "embed_dim": width,
      "depth": variant.num_layers,
      "num_heads": variant.num_heads,
      "mlp_ratio": mlp / width,
      "qkv_bias": block["qkv_bias"],
      "qkv_fused": True,
      # timm's AttentionRope has a key bias; its EvaAttention does not.
      "attn_type": "rope" if block["qkv_bias"] and block["key_bias"] else "eva",
      "qk_norm": block["qk_norm"],
      "swiglu_mlp": block["swiglu"],
      # Any alignment makes timm keep SwiGLU's gate and input apart.
      "swiglu_align_to": 1 if block["swiglu"] else 0,
      "scale_mlp": block["mlp_norm"],
      "scale_attn_inner": block["attention_norm"],
      "init_values": (form.layer_scale or 1e-5) if layer_scale else None,
      "class_token": "cls" in params,
      "num_reg_tokens": (
          params["registers"].shape[1] if "registers" in params else 0),
      "use_abs_pos_emb": POSEMB in params,
      "no_embed_class": not form.posemb_covers_prefix,
      "use_rot_pos_emb": True,
      "rope_type": _ROPE_TYPES[form.rope],
      "rope_temperature": form.rope_temperature,
      "rope_rotate_half": form.rope_layout == "half",
      "rope_grid_indexing": "xy" if form.rope_axes == "column_row" else "ij",
      "rope_grid_offset": form.rope_grid_offset,
      "ref_feat_shape": [reference, reference] if reference else None,
      "global_pool": POOLS[form.classifier],
      "use_fc_norm": "pooled_norm/scale" in params,
      "use_post_transformer_norm": "Transformer/encoder_norm/scale" in params,
      "use_pre_transformer_norm": "Transformer/pre_norm/scale" in params,
      "num_classes": 0 if head is None else head.shape[-1],
  }
  if form.classifier == "map":
    model_args["attn_pool_num_heads"] = form.map_heads or variant.num_heads
    model_args["attn_pool_mlp_ratio"] = mlp / width
  return _function(form, block), model_args


def state(params) -> dict:
  """`params` in Eva's names (the inverse of `eva.as_vit_names`)."""
  block = families.block_options(params)
  out, used = attention_pool.to_timm(params)
  modules = timm_names.MODULES if POSEMB in params else tuple(
      m for m in timm_names.MODULES if m.ours != POSEMB)
  tensors = torch_layout.to_torch(params, modules, "timm", out, used)
  if "Transformer/pre_norm/scale" in params:  # Eva's patch embedding: none.
    tensors.pop("patch_embed.proj.bias", None)
  if block["qkv_bias"] and block["key_bias"]:  # AttentionRope: qkv.bias.
    tensors = eva.as_eva_names(timm_names.fuse_qkv(tensors))
  else:  # EvaAttention: q_bias and v_bias (or none), the weights fused.
    tensors = timm_names.fuse_qkv(eva.as_eva_names(tensors))
  if block["swiglu"]:
    tensors = {
        k.replace(".mlp.fc1.", ".mlp.fc1_x."): v for k, v in tensors.items()
    }
  frequencies = sorted(
      (k for k in tensors if k.endswith(".attn.rope_frequencies")),
      key=lambda k: int(k.split(".")[1]))
  if frequencies:  # Per block 2 x H x K/2 -> 2 x depth x H x K/2.
    tensors["rope.freqs"] = np.stack([tensors.pop(k) for k in frequencies],
                                     axis=1)
  return tensors
