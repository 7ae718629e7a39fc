"""Writes `tiny_siglip_big_vision.npz` and `..._io.npz`: big_vision's own
SigLIP two-tower model (`models/proj/image_text/two_towers.py`, with the
`vit` image tower and the `proj.image_text.text_transformer` text tower)
run on a batch of images and token ids, with its parameters saved as
big_vision's released SigLIP checkpoints hold them (`params/img/...`,
`params/txt/...`, `params/t`, `params/b`; its names and shapes; written
with `np.savez_compressed`, which `np.load` reads as it reads `np.savez`).

    git clone https://github.com/google-research/big_vision /tmp/big_vision
    PYTHONPATH=/tmp/big_vision .venv/bin/python -m \
        tests.references.big_vision_siglip

Nothing of vit_jax is imported: the outputs stored are big_vision's. The
first file holds the parameters, the second the inputs (`images`, 4 of
16 x 16 x 3 in [-1, 1]; `texts`, 4 of 8 ids padded with the sticky EOS id
1) and the outputs of `apply(train=False)`: `zimg`, `ztxt` (normalised, as
two_towers returns them), `img_logits`, `txt_logits` (the heads' outputs
before normalising), `img_pre_logits`, `txt_pre_logits`, `t` (exp'd), `b`
and `logits = zimg @ ztxt.T * t + b`.
"""

import os

from big_vision.models.proj.image_text import two_towers  # pylint: disable=g-bad-import-order
import flax
import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(__file__)
PARAMS = os.path.join(HERE, "tiny_siglip_big_vision.npz")
IO = os.path.join(HERE, "tiny_siglip_big_vision_io.npz")
BATCH, SIZE, LENGTH, VOCAB, EOS = 4, 16, 8, 100, 1
TEXT_LENGTHS = (3, 5, 7, 4)  # Tokens before the EOS padding.
CONFIG = dict(
    image_model="vit",
    image=dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=(4, 4),
               pool_type="map", posemb="learn", head_zeroinit=False),
    text_model="proj.image_text.text_transformer",
    text=dict(width=32, depth=2, mlp_dim=64, num_heads=2, vocab_size=VOCAB,
              pool_type="last"),
    out_dim=(24, 24),
    temperature_init=10.0,
    bias_init=-10.0,
)


def inputs():
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (BATCH, SIZE, SIZE, 3)).astype(np.float32)
  texts = np.full((BATCH, LENGTH), EOS, np.int32)
  for b, length in enumerate(TEXT_LENGTHS):
    texts[b, :length] = rng.integers(2, VOCAB, length)
  return images, texts


def trained_like(params, seed=0):
  """Random parameters at trained scales (kernels 1/sqrt(fan-in), scales
  1 + noise, the rest O(0.3)), so every path of the model matters; the
  temperature and bias put the sigmoid logits in a useful range. Values
  are float32 on bfloat16's grid: the compressed file is then ~130 KB."""
  rng = np.random.default_rng(seed)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  out = {}
  for name, value in flat.items():
    shape = value.shape
    if name == "t":  # log temperature: t = exp(.) ~ 5.
      value = np.log(5.0) + 0.05 * rng.normal(size=shape)
    elif name == "b":
      value = -2.0 + 0.1 * rng.normal(size=shape)
    elif name.endswith("scale"):
      value = 1.0 + 0.2 * rng.normal(size=shape)
    elif name.endswith("kernel"):
      if name.endswith("out/kernel"):  # [heads, head_dim, width]
        fan_in = int(np.prod(shape[:-1]))
      elif len(shape) == 3:  # query/key/value: [width, heads, head_dim]
        fan_in = shape[0]
      else:  # Dense [in, out], Conv [h, w, c, out]
        fan_in = int(np.prod(shape[:-1]))
      value = rng.normal(size=shape) / np.sqrt(fan_in)
    else:
      value = 0.3 * rng.normal(size=shape)
    # On bfloat16's grid (kept float32), so that the file compresses well.
    out[name] = np.asarray(value).astype(jnp.bfloat16).astype(np.float32)
  return out


def main():
  jax.config.update("jax_default_matmul_precision", "highest")
  model = two_towers.Model(**CONFIG)
  images, texts = inputs()
  x = (jnp.asarray(images), jnp.asarray(texts))
  shapes = jax.eval_shape(model.init, jax.random.key(0), *x)["params"]
  flat = trained_like(shapes)
  params = flax.traverse_util.unflatten_dict(flat, sep="/")
  zimg, ztxt, out = model.apply({"params": params}, *x, train=False)
  logits = zimg @ ztxt.T * out["t"] + out["b"]
  results = dict(zimg=zimg, ztxt=ztxt, img_logits=out["img/logits"],
                 txt_logits=out["txt/logits"],
                 img_pre_logits=out["img/pre_logits"],
                 txt_pre_logits=out["txt/pre_logits"], t=out["t"], b=out["b"],
                 logits=logits)
  np.savez_compressed(PARAMS, **{
      f"params/{k}": v for k, v in sorted(flat.items())
  })
  np.savez(IO, images=images, texts=texts, **{
      k: np.asarray(v, np.float32) for k, v in results.items()
  })
  print(f"wrote {PARAMS} and {IO}: logits {np.asarray(logits).shape}, jax "
        f"{jax.__version__}, flax {flax.__version__}")


if __name__ == "__main__":
  main()
