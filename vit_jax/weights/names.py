"""This project's parameter names, and what every converter returns.

Weights of any origin are converted into the released
google-research/vision_transformer names (`models/vit.py`), flat and
'/'-joined, in the looped form: `Converted` holds them with what loading
needs beside them.
"""

import dataclasses

import numpy as np

POSEMB = "Transformer/posembed_input/pos_embedding"
FACTORIZED = (POSEMB + "_y", POSEMB + "_x")  # NaViT's per-axis tables.
PATCH_KERNEL = "embedding/kernel"
BLOCK = "Transformer/encoderblock_{}/"  # "{}": the block's index.
MAE_DECODER = "mae_decoder/"  # models/mae.py's decoder, beside the ViT.


@dataclasses.dataclass
class Converted:
  params: dict[str, np.ndarray]
  posemb_prefix_tokens: int  # Prefix tokens in the stored position embeddings.
  origin: str  # The code base that wrote it (`origins.detect`).
  notes: list[str] = dataclasses.field(default_factory=list)  # For the report.
  # Trained on images at their own shape (NaFlex's layout): run so by
  # default (config.sequence_length).
  sequences: bool = False
  # config.model options the file's layout says (timm's NaFlexViT).
  options: dict = dataclasses.field(default_factory=dict)


def is_masked_patch_part(name: str) -> bool:
  """The [mask] token and prediction head of masked patch prediction: used
  in self-supervised pre-training only (models/masked_patch.py)."""
  return name == "mask_token" or name.startswith("masked_patch_head/")


def is_mae_part(name: str) -> bool:
  """MAE's decoder: used in its pre-training only (models/mae.py)."""
  return name.startswith(MAE_DECODER)


def is_pretraining_part(name: str) -> bool:
  """A part of a self-supervised objective, not of the ViT (the features
  are the same without it)."""
  return is_masked_patch_part(name) or is_mae_part(name)


def _is_square(count: int) -> bool:
  return count > 0 and round(count**0.5)**2 == count


def posemb_prefix(params) -> int:
  """The prefix tokens (class token, registers) the stored position
  embeddings have entries for: all of them, or none where the rest is a
  square grid and the whole is not (timm's `no_embed_class`)."""
  prefix = int("cls" in params) + (params["registers"].shape[1]
                                   if "registers" in params else 0)
  table = params.get(POSEMB)
  if (table is not None and table.ndim == 3 and
      not _is_square(table.shape[1] - prefix) and _is_square(table.shape[1])):
    return 0
  return prefix
