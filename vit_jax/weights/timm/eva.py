"""timm's `Eva` model (timm/models/eva.py) beyond DINOv3: EVA-02,
RoPE-ViT (Naver's axial and mixed forms), timm's own RoPE ViTs and
Perception Encoder (PE) core, each read in a standard VisionTransformer's
names, with the options its file cannot show.

Eva's names differ from timm's VisionTransformer's in names only, renamed
here for every Eva file: LayerScale as `gamma_1`/`gamma_2`; a query and a
value bias without a key bias (`q_bias`, `v_bias`: config.model.key_bias
False); query, key and value apart (`q_proj`, `k_proj`, `v_proj`);
SwiGLU's two inputs apart (`mlp.fc1_g`, `mlp.fc1_x`) or packed in one
`mlp.fc1` (gate first: twice as wide as `fc2` reads); RoPE-Mixed's learned
frequencies in one `rope.freqs` (2 x depth x heads x K/2), split per block.

RoPE stores nothing else, so each family's RoPE is the form its timm
functions build (`models/rope.py`'s `axial`): base, channel layout, axis
order, index offset and the grid its positions are scaled to. Where a
directory's config.json names another, `timm_config.py` reads it.
"""

import numpy as np

_AXIAL = {"posemb": "learn", "rope": "axial", "rope_layout": "interleaved"}


def _eva02(tensors) -> bool:
  """A query and value bias (fused or apart), a learned table and SwiGLU
  MLPs (EVA-01, whose MLPs are GELU's, has no RoPE)."""
  names = set(tensors)
  return ("pos_embed" in names and "cls_token" in names and
          any(".attn.q_bias" in n or ".attn.q_proj." in n for n in names) and
          _swiglu(tensors))


def _swiglu(tensors) -> bool:
  if any(".mlp.fc1_g." in n for n in tensors):
    return True
  fc1, fc2 = tensors.get("blocks.0.mlp.fc1.weight"), tensors.get(
      "blocks.0.mlp.fc2.weight")
  return fc1 is not None and fc2 is not None and (fc1.shape[0]
                                                  == 2 * fc2.shape[1])


def _rope_vit(tensors) -> bool:
  """Naver's RoPE-ViT, axial (timm's AttentionRope: one fused qkv with its
  biases), a class token, LayerScale, no registers; a learned table of the
  patches in its `_ape` models."""
  names = set(tensors)
  return ("blocks.0.gamma_1" in names and "cls_token" in names and
          "blocks.0.attn.qkv.bias" in names and
          not {"reg_token", "rope.freqs", "norm_pre.weight"} & names)


def _rope_mixed(tensors) -> bool:
  return "rope.freqs" in tensors


def _timm_rope(tensors) -> bool:
  """timm's own (vit_*_rope_reg*_gap_256): registers, no class token."""
  names = set(tensors)
  return ("blocks.0.gamma_1" in names and "cls_token" not in names and
          "reg_token" in names and "blocks.0.attn.q_bias" in names)


def _pe_core(tensors) -> bool:
  """PE core: a LayerNorm before the blocks, a learned table, a class
  token, an attention pool and a final norm."""
  names = set(tensors)
  return {
      "norm_pre.weight", "attn_pool.latent", "pos_embed", "cls_token",
      "norm.weight"
  } <= names


def _pe_options(tensors) -> dict:
  """PE's RoPE positions are scaled to its table's grid (24 at 384 px);
  its attention pool has 8 heads whatever the encoder's."""
  patches = tensors["pos_embed"].shape[1] - 1
  side = int(round(patches**0.5))
  return {
      **_AXIAL, "rope_temperature": 10000.0,
      "rope_axes": "column_row",
      "rope_grid_offset": 1.0,
      "rope_reference_grid": side,
      "map_heads": 8,
      "layer_norm_eps": 1e-5,
      "classifier": "map",
      "class_token": True
  }


# (name, found(tensors), options(tensors)): what each family computes.
FAMILIES = (
    ("EVA-02 (timm's Eva, axial RoPE, SwiGLU)", _eva02, lambda t: {
        **_AXIAL, "rope_temperature": 10000.0,
        "rope_reference_grid": 16,
        "classifier": "gap" if "fc_norm.weight" in t else "token",
        "class_token": True
    }),
    ("RoPE-ViT, axial (Naver's; timm's Eva)", _rope_vit, lambda t: {
        **_AXIAL, "posemb": "learn" if "pos_embed" in t else "none",
        "rope_temperature": 100.0,
        "rope_axes": "column_row",
        "classifier": "token"
    }),
    ("RoPE-ViT, mixed (Naver's; learned frequencies)", _rope_mixed, lambda t: {
        **_AXIAL, "rope": "mixed",
        "posemb": "learn" if "pos_embed" in t else "none",
        "rope_temperature": 10.0,
        "rope_axes": "column_row",
        "classifier": "token"
    }),
    ("timm's RoPE ViT (Eva, registers)", _timm_rope, lambda t: {
        **_AXIAL, "posemb": "none",
        "rope_temperature": 10000.0,
        "rope_reference_grid": 16,
        "classifier": "gap",
        "class_token": False
    }),
    ("Perception Encoder (PE core; timm's Eva)", _pe_core, _pe_options),
)
# Eva's name endings <-> timm's VisionTransformer's, read both ways.
_ENDINGS = (
    (".attn.q_bias", ".attn.q.bias"),
    (".attn.v_bias", ".attn.v.bias"),
    (".gamma_1", ".ls1.gamma"),
    (".gamma_2", ".ls2.gamma"),
)
# Eva's modules apart where timm's VisionTransformer has them whole.
_PARTS = ((".attn.q_proj.", ".attn.q."), (".attn.k_proj.", ".attn.k."),
          (".attn.v_proj.", ".attn.v."), (".mlp.fc1_x.", ".mlp.fc1."))


def _renamed(tensors: dict, endings) -> dict:
  """`tensors` with each name's ending `old` of `endings` made `new`."""
  out = {}
  for name, value in tensors.items():
    for old, new in endings:
      if name.endswith(old):
        name = name[:-len(old)] + new
    out[name] = value
  return out


def as_eva_names(tensors) -> dict:
  """timm's VisionTransformer endings -> Eva's (LayerScale, the query and
  value biases); `as_vit_names` reads them back."""
  return _renamed(tensors, [(vit, eva) for eva, vit in _ENDINGS])


def as_vit_names(tensors, path=None) -> dict:
  """An Eva state dict (any family here, DINOv3's too) in timm's
  VisionTransformer names: see the module doc."""
  del path
  out = {}
  for name, value in _renamed(tensors, _ENDINGS).items():
    for old, new in _PARTS:
      name = name.replace(old, new)
    out[name] = value
  for name in [n for n in out if n.endswith(".mlp.fc1.weight")]:
    fc2 = out[name.replace(".fc1.", ".fc2.")]
    if out[name].shape[0] == 2 * fc2.shape[1]:  # Packed: the gate first.
      for leaf in (".weight", ".bias"):
        packed = out.pop(name.replace(".weight", leaf), None)
        if packed is not None:
          gate, value = np.split(packed, 2)
          out[name.replace(".fc1.weight", ".fc1_g" + leaf)] = gate
          out[name.replace(".weight", leaf)] = value
  freqs = out.pop("rope.freqs", None)
  if freqs is not None:  # 2 x depth x H x K/2 -> per block 2 x H x K/2.
    for i in range(freqs.shape[1]):
      out[f"blocks.{i}.attn.rope_frequencies"] = np.ascontiguousarray(freqs[:,
                                                                            i])
  return out
