"""DINOv3 in timm (its `Eva` model with `rope_type='dinov3'`, e.g.
`vit_small_patch16_dinov3`): Eva's names renamed to a standard
VisionTransformer's, and the options its file cannot show.

Eva's block differs from timm's VisionTransformer block in names only:
LayerScale as `gamma_1`/`gamma_2` (`ls1.gamma`, `ls2.gamma`), and, in the
`_qkvb` models, a query and a value bias and no key bias (a zero buffer,
not stored): `config.model.key_bias=False`, since RoPE turns keys by
their position and a key bias there would change the attention. No
position table: RoPE (`models/rope.py`) in DINOv3's form, with timm's base
of 100, on the patches only (class token and 4 registers are not
rotated). timm pools by the mean of the patch tokens after the final norm
(its default for these models; DINOv3's own probes read the class token).

Its models with SwiGLU MLPs (ViT-S+/16, H+/16, 7B/16) read the same, with
`swiglu` (`eva.py` renames every Eva file).
"""

# What the file cannot show (config.model fields), besides what its
# parameters say (registers, LayerScale, query/key/value biases).
OPTIONS = {
    "posemb": "none",
    "rope": "dinov3",
    "rope_temperature": 100.0,
    "layer_norm_eps": 1e-5,
    "classifier": "gap",
    "class_token": True,
}


def _eva_with_registers(names) -> bool:
  """Eva's LayerScale (gamma_1), a class token and registers, and no
  position table."""
  return (any(n.endswith(".gamma_1") for n in names) and
          "cls_token" in names and "reg_token" in names and
          "pos_embed" not in names)


def is_dinov3(names) -> bool:
  """DINOv3: GELU MLPs (ViT-S/16, B/16, L/16) or SwiGLU's (S+/16, H+/16)."""
  return _eva_with_registers(names)
