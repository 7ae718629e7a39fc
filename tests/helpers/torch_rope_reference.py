"""timm's RoPE encoders at a tiny size, random weights: DINOv3, EVA-02,
RoPE-ViT, timm's own RoPE ViT and PE (each timm's `Eva`), built by its
registered model function so that every option is the family's own.

Used where torch is installed (tests/references/generate.py `rope`), never
by the suite, which reads what these computed (`stored.py`).
"""

import numpy as np

from tests.helpers import torch_reference

# Width 32, 2 blocks, 4 heads (8 wide: RoPE turns 2 row and 2 column
# frequencies), patch 8, 32 px, MLP 128, 10 classes.
TINY_ROPE_SIZE = dict(embed_dim=32, depth=2, num_heads=4, patch_size=8,
                      img_size=32, num_classes=10)
TINY_ROPE_MODELS = {
    # DINOv3 ViT-S/16's form: 4 registers, LayerScale, no qkv biases,
    # LayerNorm eps 1e-5, RoPE base 100, mean of the patch tokens.
    "dinov3": "vit_small_patch16_dinov3",
    # Its `_qkvb` form: a query and a value bias, the key's a zero buffer.
    "dinov3_qkvb": "vit_small_patch16_dinov3_qkvb",
    # EVA-02 Ti's form: axial RoPE (base 10000, interleaved, positions
    # scaled to a 16-patch grid), a query and value bias, SwiGLU with its
    # two inputs packed in one fc1, a learned table, mean pooling, fc_norm.
    "eva02": "eva02_tiny_patch14_224",
    # EVA-02 B's: query, key, value apart, SwiGLU with a LayerNorm inside.
    "eva02_subln": "eva02_base_patch14_224",
    # EVA-02's CLIP tower: also a LayerNorm over the attention's heads.
    "eva02_clip": "eva02_base_patch16_clip_224",
    # RoPE-ViT's axial form (Naver): base 100, column then row, LayerScale,
    # no table, the class token.
    "rope_axial": "vit_small_patch16_rope_224",
    # ... with a learned table of the patches only.
    "rope_ape": "vit_small_patch16_rope_ape_224",
    # RoPE-ViT's mixed form: frequencies learned per block and head.
    "rope_mixed": "vit_small_patch16_rope_mixed_224",
    # timm's own RoPE ViT: no class token, 1 register, mean pooling.
    "rope_sbb": "vit_medium_patch16_rope_reg1_gap_256",
    # Perception Encoder (core): axial RoPE (offset 1, column then row,
    # scaled to the table's grid), a learned table, a LayerNorm before the
    # blocks, an attention pool of 8 heads, LayerNorm eps 1e-5.
    "pe": "vit_pe_core_tiny_patch16_384",
    # DINOv3 ViT-S+/16's: SwiGLU (its gate and input apart), mean pooling.
    "dinov3_swiglu": "vit_small_plus_patch16_dinov3",
}
# What each function's options are at the tiny size: PE's released models
# scale RoPE's positions to their table's grid (24 at 384 px), here 4; the
# models without a table read any grid (wide images too).
_ANY_GRID = dict(dynamic_img_size=True)
TINY_ROPE_ARGS = {
    "pe": dict(ref_feat_shape=(4, 4)),
    "rope_axial": _ANY_GRID,
    "rope_mixed": _ANY_GRID,
    "rope_sbb": _ANY_GRID,
}
# The models with a learned table, which timm computes at its own size only.
WITH_TABLE = ("eva02", "eva02_subln", "eva02_clip", "rope_ape", "pe")


def timm_rope_model(name: str, seed: int = None):
  """TINY_ROPE_MODELS[name], random weights: LayerNorm scales near 1 and
  LayerScale gammas of std 0.5 (not 1e-5, so that the blocks matter)."""
  timm = torch_reference.import_timm()
  if seed is None:
    seed = 40 + list(TINY_ROPE_MODELS).index(name)
  model = timm.create_model(TINY_ROPE_MODELS[name], pretrained=False,
                            **TINY_ROPE_SIZE, **TINY_ROPE_ARGS.get(name, {}))
  return torch_reference.randomize_family(model, seed, ("gamma_1", "gamma_2"))


# transformers' DINOv3ViTModel at the same size: its defaults (query and
# value biases, no key bias, RoPE base 100, LayerNorm eps 1e-5, erf GELU).
TINY_HF_DINOV3 = dict(hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128,
                      patch_size=8, image_size=32, num_register_tokens=4)

# Its gated form (the larger models'): down(SiLU(gate x) * up x).
TINY_HF_DINOV3_GATED = dict(TINY_HF_DINOV3, use_gated_mlp=True,
                            hidden_act="silu")


def hf_dinov3(seed: int = 50, gated: bool = False):
  """transformers' tiny DINOv3ViTModel, random weights as timm_rope_model's
  (its LayerScale `lambda1` of std 0.5)."""
  from transformers import DINOv3ViTConfig  # pylint: disable=g-import-not-at-top
  from transformers import DINOv3ViTModel  # pylint: disable=g-import-not-at-top
  config = DINOv3ViTConfig(
      **(TINY_HF_DINOV3_GATED if gated else TINY_HF_DINOV3),
      attn_implementation="eager")
  return torch_reference.randomize_family(DINOv3ViTModel(config), seed,
                                          (".lambda1",))


def hf_outputs(model, images_BxHxWxC, wide_BxHxWxC,
               name: str = "hf_dinov3") -> dict:
  """Its tokens after the final norm and its pooler output (the class
  token's), of the tiny images and the wide ones."""
  import torch  # pylint: disable=g-import-not-at-top
  out = {}
  for suffix, images in (("", images_BxHxWxC), ("_wide", wide_BxHxWxC)):
    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    with torch.no_grad():
      result = model(pixel_values=x)
    # Contiguous: safetensors writes an array's buffer as it lies.
    out[f"{name}_tokens{suffix}"] = np.ascontiguousarray(
        result.last_hidden_state.numpy())
    out[f"{name}_pooler{suffix}"] = np.ascontiguousarray(
        result.pooler_output.numpy())
  return out


def outputs(name: str, model, images_BxHxWxC, wide_BxHxWxC) -> dict:
  """Its logits of the tiny images and, without a learned table, of wider
  ones (another grid, no resizing), and its features (all tokens after
  the final norm)."""
  out = {
      name: torch_reference.torch_logits(model, images_BxHxWxC),
      f"{name}_features": torch_reference.torch_features(model, images_BxHxWxC),
  }
  if name not in WITH_TABLE:
    out[f"{name}_wide"] = torch_reference.torch_logits(model, wide_BxHxWxC)
  return out


def wide_images() -> np.ndarray:
  """2 images 32 x 48 (a 4 x 6 grid of patches)."""
  return np.random.default_rng(1).uniform(-1, 1, (2, 32, 48, 3)).astype(
      np.float32)
