"""Writes `tiny_naflex_big_vision.npz` and `..._io.npz`: big_vision's own
NaFlex ViT (the SigLIP 2 NaFlex image tower's code,
`models/proj/image_text/naflex_vit.py`) run on a batch of patch sequences,
with its parameters saved as big_vision saves them (`params/...`, its
names and shapes: the Dense patch embedding P*P*3 x D, the top-level
H x W x D position table).

    git clone https://github.com/google-research/big_vision /tmp/big_vision
    PYTHONPATH=/tmp/big_vision .venv/bin/python -m \
        tests.references.big_vision_naflex

Nothing of vit_jax is imported: the logits stored are big_vision's. The
first file holds the parameters, the second the inputs (patches, type, y,
x) and the logits; `tests/test_naflex_weights.py` loads the parameters
with our loader and compares.
"""

import os

from big_vision.models.proj.image_text import naflex_vit  # pylint: disable=g-bad-import-order
import flax
import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(__file__)
PARAMS = os.path.join(HERE, "tiny_naflex_big_vision.npz")
IO = os.path.join(HERE, "tiny_naflex_big_vision_io.npz")
PATCH, LENGTH, TABLE = 4, 24, 4
# One image per sequence (NaFlex): grids that shrink, keep and grow the
# 4 x 4 table, and a very wide one.
GRIDS = ((3, 5), (4, 4), (2, 2), (4, 6), (1, 7))


def inputs():
  rng = np.random.default_rng(0)
  batch = len(GRIDS)
  patches = np.zeros((batch, LENGTH, PATCH * PATCH * 3), np.float32)
  ptype = np.zeros((batch, LENGTH), np.int32)
  yabs = np.zeros((batch, LENGTH), np.int32)
  xabs = np.zeros((batch, LENGTH), np.int32)
  for b, (rows, cols) in enumerate(GRIDS):
    count = rows * cols
    patches[b, :count] = rng.uniform(-1, 1, (count, PATCH * PATCH * 3))
    ptype[b, :count] = 1
    yabs[b, :count], xabs[b, :count] = np.divmod(np.arange(count), cols)
  return patches, ptype, yabs, xabs


def trained_like(params, seed=0):
  """Random parameters at trained scales (kernels 1/sqrt(fan-in), scales
  1 + noise, the rest O(0.3)), so every path of the model matters."""
  rng = np.random.default_rng(seed)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  out = {}
  for name, value in flat.items():
    shape = value.shape
    if name.endswith("scale"):
      value = 1.0 + 0.2 * rng.normal(size=shape)
    elif name.endswith("kernel"):
      fan_in = shape[0] if len(shape) == 3 else int(np.prod(shape[:-1]))
      value = rng.normal(size=shape) / np.sqrt(fan_in)
    else:
      value = 0.3 * rng.normal(size=shape)
    out[name] = value.astype(np.float32)
  return out


def main():
  # vit_jax's "testing" variant (width 16, 2 blocks of 2 heads, patch 4).
  model = naflex_vit.Model(num_classes=7, width=16, depth=2, num_heads=2,
                           mlp_dim=32, pool_type="map", nposemb=TABLE,
                           posemb="learn_2d(8)")
  x = tuple(jnp.asarray(a) for a in inputs())
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
  flat = trained_like(shapes)
  params = flax.traverse_util.unflatten_dict(flat, sep="/")
  logits, _ = model.apply({"params": params}, x)
  names = ("patches", "type", "yabs", "xabs")
  np.savez(PARAMS, **{f"params/{k}": v for k, v in flat.items()})
  np.savez(IO, **{
      n: np.asarray(a) for n, a in zip(names, x)
  }, logits=np.asarray(logits, np.float32))
  print(f"wrote {PARAMS} and {IO}: logits {np.asarray(logits).shape}, jax "
        f"{jax.__version__}, flax {flax.__version__}")


if __name__ == "__main__":
  main()
