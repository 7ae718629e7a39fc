"""MLP-Mixer weights between timm's names and this project's. Pure numpy.

This project's names are the released Mixer's (`models/mixer.py`), flat and
'/'-joined. timm's `MlpMixer` holds the same tensors under its own names,
with PyTorch's layouts: Linear weights (out, in) where Dense kernels are
(in, out), and the patch convolution OIHW where Flax's is HWIO. `_MODULES`
pairs the modules (timm's `blocks.{i}.mlp_tokens.fc1` is our
`MixerBlock_{i}/token_mixing/Dense_0`, its `norm` our `pre_head_layer_norm`).
Anything else (timm's optional stem norm, a pre-logits layer timm has no
place for) is refused by name rather than dropped.
"""

import re

import numpy as np

from vit_jax.errors import WeightsError

# (timm's module, ours, dimensions of its weight): "{}" is a block's index.
# A 1-D weight is a LayerNorm's scale, any other a kernel.
_MODULES = (
    ("stem.proj", "stem", 4),
    ("blocks.{}.norm1", "MixerBlock_{}/LayerNorm_0", 1),
    ("blocks.{}.mlp_tokens.fc1", "MixerBlock_{}/token_mixing/Dense_0", 2),
    ("blocks.{}.mlp_tokens.fc2", "MixerBlock_{}/token_mixing/Dense_1", 2),
    ("blocks.{}.norm2", "MixerBlock_{}/LayerNorm_1", 1),
    ("blocks.{}.mlp_channels.fc1", "MixerBlock_{}/channel_mixing/Dense_0", 2),
    ("blocks.{}.mlp_channels.fc2", "MixerBlock_{}/channel_mixing/Dense_1", 2),
    ("norm", "pre_head_layer_norm", 1),
    ("head", "head", 2),
)
_TIMM_WEIGHTS = ("weight", "bias")
_OUR_WEIGHTS = {
    1: ("scale", "bias"),
    2: ("kernel", "bias"),
    4: ("kernel", "bias")
}
# PyTorch -> Flax: OIHW -> HWIO, Linear (out, in) -> Dense (in, out).
_TO_FLAX_AXES = {4: (2, 3, 1, 0), 2: (1, 0), 1: (0,)}
_TO_TORCH_AXES = {4: (3, 2, 0, 1), 2: (1, 0), 1: (0,)}


def is_timm_mixer(names) -> bool:
  """Whether a state dict's names are timm's MlpMixer's."""
  return any(".mlp_tokens." in n for n in names)


def _match(template: str, separator: str, name: str):
  """The block indices and parameter of `name` if it is `template`'s."""
  pattern = re.escape(template).replace(r"\{\}", r"(\d+)")
  match = re.fullmatch(pattern + re.escape(separator) + r"(\w+)", name)
  return (match.groups()[:-1], match.groups()[-1]) if match else None


def _convert(name: str, value, to_timm: bool):
  """(name, value) on the other side for `name` (ours if `to_timm`, else
  timm's), or None where the other side has no such parameter."""
  value = np.asarray(value)
  for timm_module, our_module, weight_ndim in _MODULES:
    source, target = ((our_module, timm_module) if to_timm else
                      (timm_module, our_module))
    found = _match(source, "/" if to_timm else ".", name)
    if found is None:
      continue
    indices, parameter = found
    ours, theirs = _OUR_WEIGHTS[weight_ndim], _TIMM_WEIGHTS
    names_here, names_there = (ours, theirs) if to_timm else (theirs, ours)
    if parameter not in names_here:
      return None
    ndim = weight_ndim if parameter == names_here[0] else 1
    if value.ndim != ndim:
      raise WeightsError(f"Mixer parameter {name} has shape {value.shape}; "
                         f"expected {ndim} dimensions.")
    axes = (_TO_TORCH_AXES if to_timm else _TO_FLAX_AXES)[ndim]
    separator = "." if to_timm else "/"
    renamed = (target.format(*indices) + separator +
               names_there[names_here.index(parameter)])
    return renamed, np.ascontiguousarray(np.transpose(value, axes))
  return None


def _convert_all(tensors, to_timm: bool) -> dict[str, np.ndarray]:
  converted = {
      name: _convert(name, value, to_timm) for name, value in tensors.items()
  }
  unknown = sorted(name for name, pair in converted.items() if pair is None)
  if unknown:
    side = "timm's MlpMixer" if to_timm else "models/mixer.py's MlpMixer"
    raise WeightsError(
        f"{', '.join(unknown)} {'has' if len(unknown) == 1 else 'have'} no "
        f"counterpart in {side} (e.g. timm's stem norm, a pre-logits layer, "
        "another model's parameter); drop those or use a model that has "
        "them.")
  return dict(converted.values())


def from_timm_mixer(state_dict) -> dict[str, np.ndarray]:
  """timm `MlpMixer` state dict (name -> array) -> flat names of ours."""
  return _convert_all(state_dict, to_timm=False)


def to_timm_mixer(flat) -> dict[str, np.ndarray]:
  """Flat names of ours -> timm `MlpMixer` state dict (contiguous arrays)."""
  return _convert_all(flat, to_timm=True)
