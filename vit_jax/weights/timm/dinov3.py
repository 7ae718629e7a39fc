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

Its models with SwiGLU MLPs (ViT-S+/16, H+/16, 7B/16) are not computed yet:
such a file is refused in one line (`weights/unsupported.py`).
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
# timm's VisionTransformer names -> Eva's, one way or the other.
_EVA_NAMES = (
    (".attn.q.bias", ".attn.q_bias"),
    (".attn.v.bias", ".attn.v_bias"),
    (".ls1.gamma", ".gamma_1"),
    (".ls2.gamma", ".gamma_2"),
)


def _eva_with_registers(names) -> bool:
  """Eva's LayerScale (gamma_1), a class token and registers, and no
  position table."""
  return (any(n.endswith(".gamma_1") for n in names) and
          "cls_token" in names and "reg_token" in names and
          "pos_embed" not in names)


def _swiglu(names) -> bool:
  return any(".mlp.fc1_g." in n for n in names)


def is_dinov3(names) -> bool:
  """DINOv3 with GELU MLPs (ViT-S/16, B/16, L/16): computed here."""
  return _eva_with_registers(names) and not _swiglu(names)


def is_swiglu_dinov3(names) -> bool:
  """DINOv3 with SwiGLU MLPs (ViT-S+/16, H+/16, 7B/16): not yet."""
  return _eva_with_registers(names) and _swiglu(names)


def _renamed(tensors: dict, endings) -> dict:
  """`tensors` with each name's ending `old` of `endings` made `new`."""
  out = {}
  for name, value in tensors.items():
    for old, new in endings:
      if name.endswith(old):
        name = name[:-len(old)] + new
    out[name] = value
  return out


def as_vit_names(tensors, path) -> dict:
  """Eva's state dict in a standard VisionTransformer's names (the query
  and value biases as split from `attn.qkv`: `attn.q.bias`)."""
  del path  # Every DINOv3 file `is_dinov3` finds renames.
  return _renamed(tensors, [(eva, vit) for vit, eva in _EVA_NAMES])


def as_eva_names(tensors) -> dict:
  """The inverse of `as_vit_names`."""
  return _renamed(tensors, _EVA_NAMES)
