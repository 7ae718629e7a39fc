"""The checkpoint families this project recognises but does not compute
yet, by origin: a file of one is refused in one line that names the
family, never loaded as a plain ViT (whose logits would differ).

A row is (the family, what it computes that this project does not, how
the file's names show it). When a family is built, its row moves to its
origin's table of families (`timm/timm_names.py`'s, transformers').
"""

from typing import Callable
from typing import NamedTuple

from vit_jax.weights.timm import dinov3


class Unsupported(NamedTuple):
  name: str
  computes: str
  found: Callable[[dict], bool]
  hint: str = ""  # What loads instead, where something does.


def _has(*parts: str):
  """Whether any name contains one of `parts`."""
  return lambda names: any(p in n for n in names for p in parts)


def _but_dinov3(found):
  """`found`, except for DINOv3's files (Eva's names too; computed:
  timm/dinov3.py)."""
  return lambda names: found(names) and not dinov3.is_dinov3(names)


def _perception_encoder(names) -> bool:
  """PE in timm: CLIP's pre-norm with an attention pool (PE core), or
  with no final norm (PE spatial); its RoPE stores nothing."""
  return "norm_pre.weight" in names and (
      "attn_pool.latent" in names or
      not ({"norm.weight", "fc_norm.weight"} & set(names)))


_ROPE = "rotary position embeddings (RoPE) on each head's queries and keys"
# timm's, first match names it (`timm/models/eva.py` builds all but the
# last); a family timm_names.FAMILIES computes is not refused (DINOv3).
TIMM = (
    Unsupported("DINOv3 with SwiGLU MLPs (its ViT-S+/16, H+/16, 7B/16)",
                "SwiGLU MLPs", dinov3.is_swiglu_dinov3,
                "DINOv3's ViT-S/16, B/16 and L/16 load"),
    Unsupported("RoPE-ViT (Naver's, learned mixed frequencies)",
                f"{_ROPE}, frequencies learned per head", _has("rope.freqs")),
    Unsupported(
        "EVA-02", f"{_ROPE}; a query and value bias without a key "
        "bias, SwiGLU MLPs with a LayerNorm inside",
        _but_dinov3(_has(".attn.q_bias", ".attn.q_proj.", ".mlp.norm."))),
    Unsupported("timm's RoPE ViT", f"{_ROPE}; Eva's blocks",
                _but_dinov3(_has(".gamma_1", "rope."))),
    Unsupported("Perception Encoder (PE)",
                f"{_ROPE} beside its learned position table",
                _perception_encoder),
    Unsupported("a ViT with a SwiGLU MLP (DINOv2's ViT-g/14)", "SwiGLU MLPs",
                _has(".mlp.fc1_g.", ".mlp.w12."), "DINOv2's ViT-S/B/L/14 load"),
)
# transformers', by their names (a directory's config.json also says its
# model_type: `MODEL_TYPES`).
TRANSFORMERS = (Unsupported(
    "DINOv3 with gated MLPs (transformers' DINOv3ViTModel, use_gated_mlp)",
    "SwiGLU MLPs", _has(".mlp.gate_proj."),
    "DINOv3's ViT-S/16, B/16 and L/16 load"),)
MODEL_TYPES = {}  # Where a model_type alone says the family: none now.
# timm's model functions (a directory's config.json names one).
TIMM_ARCHITECTURES = {
    "vit_pe_": next(r for r in TIMM if r.name.startswith("Perception")),
    "eva02_": next(r for r in TIMM if r.name == "EVA-02"),
}


def refusal(family: Unsupported, path) -> str:
  hint = f"; {family.hint}" if family.hint else ""
  return (f"{path} is {family.name}, with {family.computes}, which this "
          "project does not compute yet: it is not loaded (as a plain ViT "
          f"its logits would differ){hint}.")


def find(table, names) -> Unsupported | None:
  """The first row of `table` the names show, or None."""
  return next((row for row in table if row.found(names)), None)


def for_architecture(architecture: str) -> Unsupported | None:
  """The row of a timm model function's name, or None."""
  return next(
      (row for part, row in TIMM_ARCHITECTURES.items() if part in architecture),
      None)
