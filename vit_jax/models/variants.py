"""The table of named model variants ("ViT-B/16", "R50+ViT-B/16", "Mixer-B/16",
"testing").

A variant fixes the architecture (widths, depth, heads, patch size, hybrid
stem; for an MLP-Mixer its two MLP widths). Everything else (classes,
classifier, dropout, dtype, remat) comes from the config's `model` section,
so the same variant serves pre-training and fine-tuning.
"""

import dataclasses
from typing import Optional

from vit_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class ResNetSpec:
  """Hybrid stem: a root conv (stride 4 with its max-pool), then bottleneck
  stages."""
  num_layers: tuple[int, ...]  # Units per stage; () keeps only the root.
  width_factor: float = 1.0


@dataclasses.dataclass(frozen=True)
class Variant:
  hidden_size: int
  mlp_dim: int
  num_heads: int
  num_layers: int
  patch_size: int  # On the image (ViT) or on the stem's feature map (hybrid).
  resnet: Optional[ResNetSpec] = None

  @property
  def stride(self) -> int:
    """Pixels per token along each side of the image."""
    if self.resnet is None:
      return self.patch_size
    stem_stride = 4 * 2**max(len(self.resnet.num_layers) - 1, 0)
    return stem_stride * self.patch_size


@dataclasses.dataclass(frozen=True)
class MixerVariant:
  """An MLP-Mixer (Tolstikhin et al., 2021): no attention, no position
  embeddings; `models/mixer.py`."""
  hidden_size: int
  tokens_mlp_dim: int  # The token-mixing MLP's hidden width.
  channels_mlp_dim: int  # The channel-mixing MLP's hidden width.
  num_layers: int
  patch_size: int
  resnet = None  # Never a hybrid.
  num_heads = 0  # No attention.

  @property
  def stride(self) -> int:
    return self.patch_size

  @property
  def mlp_dim(self) -> int:
    return self.channels_mlp_dim


def is_mixer(name: str) -> bool:
  return isinstance(get_variant(name), MixerVariant)


# Encoder sizes of the paper's Table 1 (plus Ti and S from later releases).
_WIDTHS = {
    "Ti": dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    "S": dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    "B": dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    "L": dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    "H": dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
    # "Scaling Vision Transformers" (Zhai et al., 2022), Table 2: for pods.
    "g": dict(hidden_size=1408, mlp_dim=6144, num_heads=16, num_layers=40),
    "G": dict(hidden_size=1664, mlp_dim=8192, num_heads=16, num_layers=48),
    # big_vision's variant table: M, the shape-optimised So400m ("Getting ViT
    # in Shape", Alabdulmohsin et al. 2023; SigLIP's tower), g-opt, G-opt
    # and e (PaLI's ViT-e).
    "M": dict(hidden_size=512, mlp_dim=2048, num_heads=8, num_layers=12),
    "So400m": dict(hidden_size=1152, mlp_dim=4304, num_heads=16, num_layers=27),
    "g-opt": dict(hidden_size=1536, mlp_dim=6144, num_heads=16, num_layers=40),
    "G-opt": dict(hidden_size=1536, mlp_dim=8192, num_heads=16, num_layers=48),
    "e": dict(hidden_size=1792, mlp_dim=15360, num_heads=16, num_layers=56),
}
_R50 = ResNetSpec(num_layers=(3, 4, 9))  # The paper's hybrid: stage 4 removed.
_R50_FULL = ResNetSpec(num_layers=(3, 4, 6, 3))
_R26 = ResNetSpec(num_layers=(2, 2, 2, 2))
_R_ROOT = ResNetSpec(num_layers=())


def _eva02(size: str, patch: int) -> Variant:
  widths = _WIDTHS[size]
  return Variant(**dict(widths, mlp_dim=widths["hidden_size"] * 8 // 3),
                 patch_size=patch)


# EVA-02 (Fang et al. 2023): SwiGLU MLPs 8/3 as wide as the blocks.
_EVA02 = {
    f"EVA02-{size}/{patch}": _eva02(size, patch)
    for size, patch in (("Ti", 14), ("S", 14), ("B", 14), ("L", 14), ("B", 16))
}

VARIANTS: dict[str, Variant | MixerVariant] = {
    "ViT-Ti/16": Variant(**_WIDTHS["Ti"], patch_size=16),
    "ViT-S/16": Variant(**_WIDTHS["S"], patch_size=16),
    "ViT-S/32": Variant(**_WIDTHS["S"], patch_size=32),
    "ViT-B/8": Variant(**_WIDTHS["B"], patch_size=8),
    "ViT-B/16": Variant(**_WIDTHS["B"], patch_size=16),
    "ViT-B/32": Variant(**_WIDTHS["B"], patch_size=32),
    "ViT-L/16": Variant(**_WIDTHS["L"], patch_size=16),
    "ViT-L/32": Variant(**_WIDTHS["L"], patch_size=32),
    # Patch 14: DINOv2's S, B and L.
    "ViT-S/14": Variant(**_WIDTHS["S"], patch_size=14),
    "ViT-B/14": Variant(**_WIDTHS["B"], patch_size=14),
    "ViT-L/14": Variant(**_WIDTHS["L"], patch_size=14),
    "ViT-H/14": Variant(**_WIDTHS["H"], patch_size=14),
    "ViT-g/14": Variant(**_WIDTHS["g"], patch_size=14),
    "ViT-G/14": Variant(**_WIDTHS["G"], patch_size=14),
    "ViT-M/16": Variant(**_WIDTHS["M"], patch_size=16),
    "ViT-M/32": Variant(**_WIDTHS["M"], patch_size=32),
    "ViT-So400m/14": Variant(**_WIDTHS["So400m"], patch_size=14),
    "ViT-So400m/16": Variant(**_WIDTHS["So400m"], patch_size=16),
    "ViT-g-opt/14": Variant(**_WIDTHS["g-opt"], patch_size=14),
    "ViT-g-opt/16": Variant(**_WIDTHS["g-opt"], patch_size=16),
    "ViT-G-opt/14": Variant(**_WIDTHS["G-opt"], patch_size=14),
    "ViT-e/14": Variant(**_WIDTHS["e"], patch_size=14),
    **_EVA02,
    "R50+ViT-B/16": Variant(**_WIDTHS["B"], patch_size=1, resnet=_R50),
    "R50+ViT-L/32": Variant(**_WIDTHS["L"], patch_size=1, resnet=_R50_FULL),
    "R26+ViT-S/32": Variant(**_WIDTHS["S"], patch_size=1, resnet=_R26),
    "R26+ViT-B/32": Variant(**_WIDTHS["B"], patch_size=1, resnet=_R26),
    "R+ViT-Ti/16": Variant(**_WIDTHS["Ti"], patch_size=8, resnet=_R_ROOT),
    # Tiny models for tests and CPU demos.
    "testing": Variant(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                       patch_size=4),
    "testing-hybrid": Variant(
        hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=1,
        resnet=ResNetSpec(num_layers=(1, 1), width_factor=0.5)),
    "digits": Variant(hidden_size=64, mlp_dim=256, num_heads=4, num_layers=4,
                      patch_size=4),
    # Half its width (its heads half as wide): configs/distill.py's student.
    "digits-small": Variant(hidden_size=32, mlp_dim=128, num_heads=4,
                            num_layers=4, patch_size=4),
}
# The Mixer paper's Table 1 (the released checkpoints are B/16 and L/16):
# width, token-MLP and channel-MLP widths, blocks.
_MIXER_WIDTHS = {
    "S": (512, 256, 2048, 8),
    "B": (768, 384, 3072, 12),
    "L": (1024, 512, 4096, 24),
    "H": (1280, 640, 5120, 32),
}
VARIANTS.update({
    f"Mixer-{size}/{patch}": MixerVariant(*_MIXER_WIDTHS[size], patch)
    for size, patch in (("S", 32), ("S", 16), ("B", 32), ("B", 16), ("L", 32),
                        ("L", 16), ("H", 14))
})
VARIANTS["testing-mixer"] = MixerVariant(16, 8, 32, 2, 4)
VARIANTS["digits-mixer"] = MixerVariant(64, 32, 256, 4, 4)  # For CPU demos.


def register(name: str, variant: Variant) -> Variant:
  """Adds a variant (a module of config.imports may add its own); refuses
  widths the attention cannot split and a name taken by another variant."""
  if isinstance(variant, Variant) and variant.hidden_size % variant.num_heads:
    raise UserError(f"Variant {name!r}: hidden_size {variant.hidden_size} is "
                    f"not divisible by num_heads {variant.num_heads}.")
  if min(dataclasses.astuple(variant)[:5]) < 1:
    raise UserError(f"Variant {name!r}: every size must be positive "
                    f"({variant}).")
  if name in VARIANTS and VARIANTS[name] != variant:
    raise UserError(f"The model variant {name!r} is registered twice, as "
                    f"{VARIANTS[name]} and {variant}.")
  VARIANTS[name] = variant
  return variant


def check_image_size(name: str, image_size: int, where: str = "image size",
                     patch_size: Optional[int] = None):
  """Refuses an image size the variant's patches (or `patch_size`'s, where
  it runs at another, FlexiViT) do not tile, before the model is traced."""
  stride = patch_size or get_variant(name).stride
  if image_size < 1 or image_size % stride:
    whose = f"{name} run at patch size {patch_size}" if patch_size else name
    raise UserError(
        f"The {where} {image_size} is not a multiple of the {stride}-pixel "
        f"patches of {whose}; use e.g. "
        f"{max(stride, round(image_size / stride) * stride)}.")


def get_variant(name: str) -> Variant | MixerVariant:
  if name not in VARIANTS:
    raise UserError(
        f"Unknown model variant {name!r}. Pick one of: {', '.join(VARIANTS)} "
        "(set it with --config.model.variant=NAME).")
  return VARIANTS[name]
