"""Looped and scanned encoder parameters, and conversion between the two.

Looped (released checkpoints): `Transformer/encoderblock_{i}/...`.
Scanned (`scan_layers=True`): `Transformer/encoderblock/...` with a leading
layer axis on every leaf.

The conversion works on flat {'/'-joined name: array} dicts (what weights
files hold); the tree versions flatten, convert and unflatten.
"""

import re

import flax
import jax
import numpy as np

from vit_jax.errors import UserError
from vit_jax.errors import WeightsError

ENCODER = "Transformer"  # Where the repeated blocks live.
_BLOCK = re.compile(r"^encoderblock_(\d+)$")
_LOOPED_NAME = re.compile(r"^Transformer/encoderblock_(\d+)/(.*)$")
_SCANNED_PREFIX = "Transformer/encoderblock/"


def is_scanned(params) -> bool:
  return "encoderblock" in params.get(ENCODER, {})


def encoder_blocks(params) -> list[str]:
  """Names of the repeated blocks under `params[ENCODER]`: the one scanned
  block (its leaves carry the layer axis), or each layer's, in order."""
  encoder = params.get(ENCODER, {})
  if is_scanned(params):
    return ["encoderblock"]
  return sorted((k for k in encoder if _BLOCK.match(k)),
                key=lambda k: int(_BLOCK.match(k).group(1)))


def num_scanned_layers(params) -> int:
  """The length of the layer axis of a scanned tree."""
  return jax.tree.leaves(params["Transformer"]["encoderblock"])[0].shape[0]


def stack_flat(flat: dict, num_layers: int) -> dict:
  """Looped -> scanned names; other names pass through.

  A scan needs every layer of a parameter, so one with only some of its
  `num_layers` layers (the rest left out, e.g. by `dont_load`) is a
  WeightsError; one with none is simply absent from the result.
  """
  out, per_leaf = {}, {}
  for name, value in flat.items():
    m = _LOOPED_NAME.match(name)
    if m:
      per_leaf.setdefault(m.group(2), {})[int(m.group(1))] = value
    else:
      out[name] = value
  for rest, layers in per_leaf.items():
    if sorted(layers) != list(range(num_layers)):
      raise WeightsError(f"Only some layers of encoderblock/{rest} are loaded; "
                         "a scanned model loads all layers of a parameter "
                         "or none (see config.init.dont_load).")
    out[_SCANNED_PREFIX + rest] = np.stack(
        [layers[i] for i in range(num_layers)])
  return out


def unstack_flat(flat: dict) -> dict:
  """Scanned -> looped names (`encoderblock_{i}`); other names pass through."""
  stacked = {k: v for k, v in flat.items() if k.startswith(_SCANNED_PREFIX)}
  if not stacked:
    return flat
  out = {k: v for k, v in flat.items() if k not in stacked}
  for name, value in stacked.items():
    rest = name[len(_SCANNED_PREFIX):]
    for i in range(value.shape[0]):
      out[f"Transformer/encoderblock_{i}/{rest}"] = value[i]
  return out


def stack_layers(params):
  """Looped -> scanned. Returns a new tree; other entries are shared."""
  encoder = params["Transformer"]
  indices = sorted(int(m.group(1)) for k in encoder if (m := _BLOCK.match(k)))
  if indices != list(range(len(indices))) or not indices:
    raise UserError(f"Expected encoderblock_0..N-1, found blocks {indices}.")
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  return flax.traverse_util.unflatten_dict(stack_flat(flat, len(indices)),
                                           sep="/")


def unstack_layers(params):
  """Scanned -> looped."""
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  return flax.traverse_util.unflatten_dict(unstack_flat(flat), sep="/")
