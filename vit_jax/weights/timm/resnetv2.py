"""timm's hybrid ViT backbone (ResNetV2, `patch_embed.backbone.*`) read
under the released names (`conv_root`, `gn_root`, `block{s}/unit{u}/...`).
"""

import re

import numpy as np

from vit_jax.errors import WeightsError

_TIMM_UNIT = {
    "conv1": "conv1",
    "conv2": "conv2",
    "conv3": "conv3",
    "norm1": "gn1",
    "norm2": "gn2",
    "norm3": "gn3",
    "downsample.conv": "conv_proj",
    "downsample.norm": "gn_proj"
}


def stem_params(tensors) -> dict[str, np.ndarray]:
  """timm's hybrid backbone (ResNetV2, `patch_embed.backbone.*`) -> the
  released names (`conv_root`, `gn_root`, `block{s}/unit{u}/...`)."""
  params = {}
  for name, value in tensors.items():
    if not name.startswith("patch_embed.backbone."):
      continue
    rest = name[len("patch_embed.backbone."):]
    leaf = {
        "weight": "kernel" if value.ndim == 4 else "scale",
        "bias": "bias"
    }[rest.rsplit(".", 1)[1]]
    if value.ndim == 4:
      value = value.transpose(2, 3, 1, 0)
    if rest.startswith("stem."):
      module = {"conv": "conv_root", "norm": "gn_root"}[rest.split(".")[1]]
    else:
      m = re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.(.+)\.\w+", rest)
      if not m or m.group(3) not in _TIMM_UNIT:
        raise WeightsError(f"Unknown timm ResNetV2 parameter {name!r}.")
      module = (f"block{int(m.group(1)) + 1}/unit{int(m.group(2)) + 1}/"
                f"{_TIMM_UNIT[m.group(3)]}")
    params[f"{module}/{leaf}"] = value
  return params
