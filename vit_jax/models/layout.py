"""Conversion between the looped and the scanned parameter layouts.

Looped (released checkpoints): `Transformer/encoderblock_{i}/...`.
Scanned (`scan_layers=True`): `Transformer/encoderblock/...` with a leading
layer axis on every leaf.
"""

import re

import jax
import numpy as np

from vit_jax.errors import UserError

_BLOCK = re.compile(r"^encoderblock_(\d+)$")


def is_scanned(params) -> bool:
  return "encoderblock" in params.get("Transformer", {})


def stack_layers(params):
  """Looped -> scanned. Returns a new tree; other entries are shared."""
  encoder = dict(params["Transformer"])
  indices = sorted(int(m.group(1)) for k in encoder if (m := _BLOCK.match(k)))
  if indices != list(range(len(indices))) or not indices:
    raise UserError(f"Expected encoderblock_0..N-1, found blocks {indices}.")
  blocks = [encoder.pop(f"encoderblock_{i}") for i in indices]
  encoder["encoderblock"] = jax.tree.map(lambda *x: np.stack(x), *blocks)
  return {**params, "Transformer": encoder}


def unstack_layers(params):
  """Scanned -> looped."""
  encoder = dict(params["Transformer"])
  stacked = encoder.pop("encoderblock")
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  for i in range(num_layers):
    encoder[f"encoderblock_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, "Transformer": encoder}
