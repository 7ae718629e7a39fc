"""Max |logit difference| of full-size models against independent code.

    .venv/bin/python -m tests.helpers.parity_report

ViT-B/16 and R50+ViT-B/16 with random weights at trained scales (dense
kernels std 1/sqrt(fan-in), stem conv kernels std 0.01-0.05), fp32, two
224 px images:

  ours (tanh GELU)  vs the float64 numpy reference
                    (tests/helpers/numpy_reference.py)
  ours (erf GELU)   vs timm and Hugging Face, their weights loaded here
  ours (tanh GELU)  vs timm, to show what the GELU form alone changes

timm's and Hugging Face's logits are the ones those libraries computed
(tests/references/full_size.json, written by tests/references/generate.py),
with weights both sides draw from the same seed; PyTorch is not needed
here. Not a test (it takes a minute or two); the tests run the same
comparisons on tiny models.
"""

import os
import tempfile

import flax
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import numpy as st_numpy

from tests.helpers import numpy_reference
from tests.helpers import tiny_models
from tests.references import stored
from vit_jax import models
from vit_jax import weights
from vit_jax.config import defaults


def build(variant: str, gelu_approximate: bool, num_classes: int = 1000):
  config = defaults.get_model_config()
  config.variant = variant
  config.gelu_approximate = gelu_approximate
  return tiny_models.build(config, num_classes)


def ours(model, params, images):
  return np.asarray(
      jax.jit(lambda p, x: model.apply({"params": p}, x)[0])(params, images))


def against_stored(name, variant, images, gelu_approximate):
  """Loads the stored model's weights (regenerated from its seed) here; max
  |logit difference| to the logits its library computed."""
  entry = stored.full_size()[name]
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "weights.safetensors")
    st_numpy.save_file(stored.trained_like_state(entry["parameters"]), path)
    model = build(variant, gelu_approximate)
    size = images.shape[1]
    grid = (size // models.get_variant(variant).stride,) * 2
    target = jax.eval_shape(lambda: model.init(jax.random.key(
        0), jnp.zeros((1, size, size, 3)))["params"])
    loaded, report = weights.load(path, target, num_prefix_tokens=1, grid=grid,
                                  gelu_approximate=gelu_approximate)
    assert report.ok and not report.reinitialised, report.table()
    params = flax.traverse_util.unflatten_dict(loaded, sep="/")
  return float(np.abs(ours(model, params, images) - entry["logits"]).max())


def main():
  jax.config.update("jax_platforms", "cpu")  # libtpu may be installed.
  images = stored.full_size_images()
  rows = []
  for variant in ("ViT-B/16", "R50+ViT-B/16"):
    model = build(variant, True)
    shapes = jax.eval_shape(model.init, jax.random.key(0), images[:1])["params"]
    params = numpy_reference.trained_like_params(shapes)
    want, _ = numpy_reference.vit(params, images,
                                  models.get_variant(variant).patch_size)
    rows.append((variant, "numpy reference (tanh GELU)",
                 float(np.abs(ours(model, params, images) - want).max()),
                 float(np.abs(want).max())))
  full_size = stored.full_size()
  for variant, name in (("ViT-B/16", "vit_base_patch16_224"),
                        ("R50+ViT-B/16",
                         "vit_base_r50_s16_224"), ("ViT-B/16", "hf_vit_base")):
    rows.append((variant, full_size[name]["description"],
                 against_stored(name, variant, images, False), None))
    if name.startswith("vit_"):
      rows.append((variant, "timm, but our model with tanh GELU",
                   against_stored(name, variant, images, True), None))
  print(f"{'model':<14} {'against':<50} {'max |dlogit|':>12}")
  for variant, against, error, scale in rows:
    extra = f"  (max |logit| {scale:.2f})" if scale else ""
    print(f"{variant:<14} {against:<50} {error:12.2e}{extra}")


if __name__ == "__main__":
  main()
