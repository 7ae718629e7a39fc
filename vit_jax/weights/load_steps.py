"""The named steps that take each of a model's parameters from a converted
file, and the policies that drop file entries it has no place for.

`STEPS` run in order for every parameter of the model; the first that
applies decides its `Outcome`: loaded as it is, resized (position
embeddings to the new grid, NaViT's per-axis tables, a Mixer's token
mixing for K times the resolution, FlexiViT's PI-resized patch kernel),
re-initialised by policy (`config.init.dont_load`, a head of other
classes, masked patch prediction's parts), missing or mismatched. `DROPS`
say why a file entry without a place in the model may be left out; any
other is unexpected. A new kind of resizing is a step here.
"""

import dataclasses
import re
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Sequence

import numpy as np

from vit_jax.models import patch_resize
from vit_jax.weights import mixer_layout
from vit_jax.weights import posemb
from vit_jax.weights.names import FACTORIZED
from vit_jax.weights.names import PATCH_KERNEL
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.names import is_mae_part
from vit_jax.weights.names import is_masked_patch_part
from vit_jax.weights.names import is_pretraining_part


@dataclasses.dataclass(frozen=True)
class Target:
  """What the steps know of the model and the config's loading policy."""
  num_prefix_tokens: int  # Position-embedding entries before the grid.
  grid: tuple[int, int]  # The model's token grid.
  resize_method: str  # config.init.posemb_resize.
  source_grid: Optional[tuple[int, int]]  # config.init.source_grid.
  dont_load: Sequence[str]  # config.init.dont_load's regexes.
  has_head: bool
  # How the model reads a table on images at their own shape
  # (config.model.posemb_interpolation); None: the file's own.
  sequence_interpolation: Optional[str] = None


class Outcome(NamedTuple):
  """What became of one parameter: `kind` names the report's list that
  gets `row` (matched, resized, reinitialised, missing, mismatched), and
  `value` is what was loaded (None: nothing)."""
  kind: str
  row: object
  value: Optional[np.ndarray] = None


def matches(regexes: Sequence[str], name: str) -> bool:
  return any(re.fullmatch(r, name) for r in regexes)


def _not_loaded(name, value, shape, source, target):
  """config.init.dont_load, or absent from the file."""
  if matches(target.dont_load, name):
    return Outcome("reinitialised", (name, "config.init.dont_load"))
  if value is None:
    if name.startswith("head/") or is_pretraining_part(name):
      return Outcome("reinitialised", (name, "not in the file"))
    return Outcome("missing", name)
  return None


def _position_embeddings(name, value, shape, source, target):
  """The file's position embeddings on the model's grid: the grid part
  interpolated in 2D (corner to corner, as the paper; a NaFlex file's as
  the model reads it on images at their own shape), the prefix entries
  kept, dropped (no class token in the model) or added as zeros (the
  file's class token had none)."""
  if name != POSEMB:
    return None
  if value.ndim == 2:
    value = value[None]
  mismatched = Outcome("mismatched", (POSEMB, tuple(value.shape), shape))
  if value.shape[-1] != shape[-1]:
    return mismatched
  prefix, wanted = source.posemb_prefix_tokens, target.num_prefix_tokens
  old_grid = (tuple(target.source_grid) if target.source_grid else
              posemb.square_grid(value.shape[1] - prefix, source.origin))
  method, how = target.resize_method, target.resize_method
  if source.sequences:  # NaFlex's: as the model reads it at that grid.
    method = (target.sequence_interpolation or
              source.options.get("posemb_interpolation", "bilinear"))
    how = f"{method}, antialiased, as images at their own shape read it"
    resized = posemb.resize_as_sequences(value, prefix, old_grid, target.grid,
                                         method)
  else:
    resized = posemb.resize_posemb(value, prefix, old_grid, target.grid, method)
  if prefix > wanted:
    resized = resized[:, prefix - wanted:]
  elif prefix < wanted:
    zeros = np.zeros((1, wanted - prefix, shape[-1]), value.dtype)
    resized = np.concatenate([zeros, resized], axis=1)
  if tuple(resized.shape) != shape:
    return mismatched
  if tuple(value.shape) == shape and old_grid == tuple(target.grid):
    return Outcome("matched", POSEMB, resized)
  grid = target.grid
  return Outcome(
      "resized",
      (POSEMB, tuple(value.shape), shape, f"{old_grid[0]}x{old_grid[1]} -> "
       f"{grid[0]}x{grid[1]} grid, {how}"), resized)


def _same_shape(name, value, shape, source, target):
  if tuple(value.shape) == shape:
    return Outcome("matched", name, value)
  return None


def _factorized_axis(name, value, shape, source, target):
  """NaViT's table of one axis, resized along it as a grid of one column."""
  if name not in FACTORIZED or value.shape[::2] != shape[::2]:
    return None
  method = target.resize_method
  resized = posemb.resize_grid(value[0][:, None], (shape[1], 1),
                               method)[None, :, 0]
  return Outcome("resized", (name, tuple(
      value.shape), shape, f"{value.shape[1]} -> {shape[1]}, {method}"),
                 resized)


def _mixer_tiles(name, value, shape, source, target):
  """A Mixer's token mixing for K times the resolution."""
  k = mixer_layout.tiles_between(value.shape, shape, name)
  if not k:
    return None
  return Outcome("resized", (name, tuple(
      value.shape), shape, f"{k * k} tiles, block-diagonal: the Mixer "
                             "paper's Supplementary C"),
                 mixer_layout.tile_token_mixing(name, value, k))


def _patch_kernel(name, value, shape, source, target):
  """FlexiViT's PI-resize of the patch embedding to another patch size."""
  if name != PATCH_KERNEL or value.shape[2:] != shape[2:]:
    return None
  return Outcome("resized",
                 (name, tuple(value.shape), shape, "PI-resize, as FlexiViT"),
                 patch_resize.pi_resize(value, shape[:2]))


def _other_head(name, value, shape, source, target):
  """A head of other classes, a masked-patch head of other outputs."""
  if name.startswith("head/"):
    return Outcome("reinitialised",
                   (name, f"{value.shape[-1]} classes in the file, "
                    f"{shape[-1]} in the config"))
  if name.startswith("masked_patch_head/Dense_1/"):  # Target-dependent.
    return Outcome("reinitialised",
                   (name, f"{value.shape[-1]} outputs in the file, "
                    f"{shape[-1]} for the config's config.masked_patch"))
  return None


def _mismatched(name, value, shape, source, target):
  return Outcome("mismatched", (name, tuple(value.shape), shape))


Step = Callable[[str, Optional[np.ndarray], tuple, Converted, Target],
                Optional[Outcome]]
STEPS: tuple[Step, ...] = (_not_loaded, _position_embeddings, _same_shape,
                           _factorized_axis, _mixer_tiles, _patch_kernel,
                           _other_head, _mismatched)

# (why a file entry without a place in the model is left out, whether it
# applies to a name).
DROPS: tuple[tuple[str, Callable[[str, Target], bool]], ...] = (
    ("config.init.dont_load", lambda name, t: matches(t.dont_load, name)),
    ("the model has no head",
     lambda name, t: name.startswith("head/") and not t.has_head),
    ("config.model.representation_size=None",
     lambda name, t: name.startswith("pre_logits/")),
    ("masked patch prediction only",
     lambda name, t: is_masked_patch_part(name)),
    ("MAE's decoder, pre-training only", lambda name, t: is_mae_part(name)),
)


def outcome(name: str, value, shape: tuple, source: Converted,
            target: Target) -> Outcome:
  """The first step's outcome that applies to parameter `name`."""
  for step in STEPS:
    found = step(name, value, shape, source, target)
    if found is not None:
      return found
  raise AssertionError("_mismatched applies to every parameter.")


def why_dropped(name: str, target: Target) -> Optional[str]:
  """Why file entry `name` may be left out, or None (unexpected)."""
  return next((why for why, applies in DROPS if applies(name, target)), None)
