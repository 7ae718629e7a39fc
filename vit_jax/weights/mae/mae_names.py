"""facebookresearch/mae's checkpoints <-> this project's names.

Its encoder is timm's VisionTransformer in timm's names (`blocks.{i}.`,
`cls_token`, `pos_embed`, ...): an encoder file (`mae_pretrain_vit_*.pth`,
and timm's `vit_*_patch16_224.mae`) is a timm file. A full checkpoint
(`mae_pretrain_vit_*_full.pth`, `mae_visualize_vit_*.pth`) adds the decoder
of its `models_mae.py`: `decoder_embed`, `mask_token`, `decoder_pos_embed`
(fixed 2D sin-cos), `decoder_blocks.{i}.` (timm's blocks again),
`decoder_norm` and `decoder_pred`, which become `models/mae.py`'s decoder
under `mae_decoder/`. Its position embeddings are not stored here (the
decoder computes them): the file's are checked to be the same. A full
checkpoint is the origin `mae` of `origins.ORIGINS` (registered here),
asked before timm's.
"""

import math

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.models import embeddings
from vit_jax.weights import origins
from vit_jax.weights import torch_layout
from vit_jax.weights.names import MAE_DECODER
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.timm import timm_names

# Every released decoder (models_mae.py's dec512d8b) has 16 heads, which a
# fused qkv does not show.
DECODER_HEADS = 16
_BLOCKS = "decoder_blocks."


def is_full(names) -> bool:
  """Whether a state dict holds MAE's decoder beside its encoder."""
  return "decoder_embed.weight" in names


def _dense(tensors, theirs: str, ours: str) -> dict:
  return {
      f"{ours}/kernel": tensors[f"{theirs}.weight"].T,
      f"{ours}/bias": tensors[f"{theirs}.bias"]
  }


def _check_posemb(table, path: str) -> str:
  """The file's decoder_pos_embed against the sin-cos table the decoder
  computes: a note for the report, or a refusal where they differ."""
  table = np.asarray(table, np.float32).reshape(-1, table.shape[-1])
  side = math.isqrt(table.shape[0] - 1)
  expected = embeddings.mae_sincos_table(side, side, table.shape[-1])
  if side * side != table.shape[0] - 1 or not (np.allclose(
      table[0], 0.0) and np.allclose(table[1:], expected, atol=1e-5)):
    raise WeightsError(
        f"{path}: its decoder_pos_embed is not MAE's fixed 2D sin-cos table "
        "(a class-token row of zeros, then the grid's), which the decoder "
        "here computes; this is not a models_mae.py checkpoint.")
  return (f"MAE's decoder ({side}x{side} grid): its position embeddings "
          "are the fixed sin-cos ones the decoder computes")


def from_mae(tensors, num_heads: int, path: str) -> Converted:
  """A full MAE checkpoint: the encoder by timm's room, the decoder under
  `mae_decoder/`."""
  decoder = {
      k: v
      for k, v in tensors.items()
      if k.startswith("decoder_") or k == "mask_token"
  }
  converted = timm_names.from_timm(
      {
          k: v for k, v in tensors.items() if k not in decoder
      }, num_heads, path)
  note = _check_posemb(decoder["decoder_pos_embed"], path)
  # The decoder's blocks and norm are a timm encoder's, renamed back.
  as_timm = {
      "blocks." + k[len(_BLOCKS):]: v
      for k, v in decoder.items()
      if k.startswith(_BLOCKS)
  }
  as_timm.update({
      f"norm.{leaf}": decoder[f"decoder_norm.{leaf}"]
      for leaf in ("weight", "bias")
  })
  params = torch_layout.from_torch(timm_names.split_qkv(as_timm),
                                   timm_names.MODULES, DECODER_HEADS, path,
                                   ("embedding", POSEMB))
  params.update(_dense(decoder, "decoder_embed", "embed"))
  params.update(_dense(decoder, "decoder_pred", "pred"))
  params["mask_token"] = decoder["mask_token"]
  converted.params.update({MAE_DECODER + k: v for k, v in params.items()})
  converted.notes.append(note)
  converted.origin = "mae"
  return converted


def _convert(fmt: str, tensors, num_heads: int, path: str) -> Converted:
  del fmt  # A pickle (its .pth) or a safetensors file: the same names.
  return from_mae(tensors, num_heads, path)


origins.register(
    "mae",
    origins.Origin("facebookresearch/mae (encoder and decoder)",
                   gelu_approximate=False, convert=_convert, claims=is_full,
                   rank=10))
