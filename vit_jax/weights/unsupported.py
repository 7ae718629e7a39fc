"""The checkpoint families this project recognises but does not compute
yet, by origin: a file of one is refused in one line that names the
family, never loaded as a plain ViT (whose logits would differ).

A row is (the family, what it computes that this project does not, how
the file's names show it). When a family is built, its row moves to its
origin's table of families (`timm/timm_names.py`'s, transformers').
"""

from typing import Callable
from typing import NamedTuple

from vit_jax.errors import WeightsError


class Unsupported(NamedTuple):
  name: str
  computes: str
  found: Callable[[dict], bool]
  hint: str = ""  # What loads instead, where something does.


def _has(*parts: str):
  """Whether any name contains one of `parts`."""
  return lambda names: any(p in n for n in names for p in parts)


def _perception_encoder_no_final_norm(names) -> bool:
  """PE spatial and lang in timm: a LayerNorm before the blocks, none
  after them or on pooled features, no attention pool."""
  return "norm_pre.weight" in names and not (
      {"norm.weight", "fc_norm.weight", "attn_pool.latent"} & set(names))


_ROPE = "rotary position embeddings (RoPE) on each head's queries and keys"
# timm's, first match names it; the families timm/timm_names.FAMILIES
# computes (DINOv3, EVA-02, RoPE-ViT, timm's RoPE ViTs, PE core) are not
# refused.
TIMM = (
    Unsupported("Perception Encoder spatial or lang (PE spatial, PE lang)",
                f"{_ROPE} and no final LayerNorm",
                _perception_encoder_no_final_norm, "PE core loads"),
    Unsupported("DINOv2's own SwiGLU MLP (w12, w3: DINOv2's ViT-g/14)",
                "SwiGLU MLPs in DINOv2's own names", _has(".mlp.w12."),
                "timm's and transformers' DINOv2 files load"),
)
# What is left of timm's Eva names once a family has renamed them: a form
# no family here reads (EVA-01, Eva's post-norm blocks, ...).
_EVA_LEFT = (".attn.q_bias", ".attn.q_proj.", ".gamma_1", "rope.")


def refuse_eva_left(tensors, path):
  """Refuses, in one line, a timm Eva state dict no family read."""
  left = sorted(n for n in tensors if any(p in n for p in _EVA_LEFT))
  if left:
    raise WeightsError(
        f"{path} is timm's Eva model in a form this project does not "
        f"compute (e.g. EVA-01, or RoPE without EVA-02's SwiGLU: "
        f"{left[0]!r} is not read); it is not loaded (as a plain ViT its "
        "logits would differ). DINOv3, EVA-02, RoPE-ViT, timm's RoPE ViTs "
        "and PE core load.")


# transformers', by their names (a directory's config.json also says its
# model_type: `MODEL_TYPES`).
TRANSFORMERS = ()  # transformers' DINOv3 with gated MLPs now loads.
MODEL_TYPES = {}  # Where a model_type alone says the family: none now.
# timm's model functions (a directory's config.json names one).
TIMM_ARCHITECTURES = {"vit_pe_spatial_": TIMM[0], "vit_pe_lang_": TIMM[0]}


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
