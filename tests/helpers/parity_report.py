"""Max |logit difference| of full-size models against independent code.

    .venv/bin/python -m tests.helpers.parity_report [--size=224] [--batch=2]

ViT-B/16 and R50+ViT-B/16 with random weights at trained scales (dense
kernels std 1/sqrt(fan-in), stem conv kernels std 0.01-0.05), fp32:

  ours (tanh GELU)  vs the float64 numpy reference
                    (tests/helpers/numpy_reference.py)
  ours (erf GELU)   vs timm and Hugging Face, their weights loaded here
  ours (tanh GELU)  vs timm, to show what the GELU form alone changes

Nothing is downloaded: timm and Hugging Face models are built from their
classes. Not a test (it takes a minute or two); the tests run the same
comparisons on tiny models.
"""

import argparse
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers import numpy_reference
from tests.helpers import torch_reference
from vit_jax import models
from vit_jax import weights
from vit_jax.config import defaults


def build(variant: str, gelu_approximate: bool, num_classes: int = 1000):
  config = defaults.get_model_config()
  config.variant = variant
  config.gelu_approximate = gelu_approximate
  return models.build_model(config, num_classes)


def ours(model, params, images):
  return np.asarray(
      jax.jit(lambda p, x: model.apply({"params": p}, x)[0])(params, images))


def trained_like_torch(module, seed: int = 0):
  """torch parameters at the scales of numpy_reference.trained_like_params."""
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      shape = tuple(p.shape)
      if len(shape) == 4 and "backbone" in name:
        value = rng.uniform(0.01, 0.05) * rng.normal(size=shape)
      elif len(shape) >= 2 and name.endswith("weight"):
        value = rng.normal(size=shape) / np.sqrt(np.prod(shape[1:]))
      elif name.endswith("weight"):  # LayerNorm / GroupNorm scales.
        value = 1.0 + 0.2 * rng.normal(size=shape)
      else:
        value = 0.3 * rng.normal(size=shape)
      p.copy_(torch.from_numpy(value.astype(np.float32)))
  return module.eval()


def against_torch(torch_model, variant, images, size, gelu_approximate):
  """Loads the torch model's weights here; max |Δlogit| of the two."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "weights.safetensors")
    torch_reference.save_state_dict(torch_model, path)
    model = build(variant, gelu_approximate)
    grid = (size // models.get_variant(variant).stride,) * 2
    target = jax.eval_shape(lambda: model.init(jax.random.key(
        0), jnp.zeros((1, size, size, 3)))["params"])
    loaded, report = weights.load(path, target, num_prefix_tokens=1, grid=grid,
                                  gelu_approximate=gelu_approximate)
    assert report.ok and not report.reinitialised, report.table()
    import flax  # pylint: disable=g-import-not-at-top
    params = flax.traverse_util.unflatten_dict(loaded, sep="/")
  theirs = torch_reference.torch_logits(torch_model, images)
  return float(np.abs(ours(model, params, images) - theirs).max())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--size", type=int, default=224)
  parser.add_argument("--batch", type=int, default=2)
  args = parser.parse_args()
  size = args.size
  images = np.random.default_rng(0).uniform(
      -1, 1, (args.batch, size, size, 3)).astype(np.float32)
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
  timm = torch_reference.import_timm()
  for variant, name in (("ViT-B/16", "vit_base_patch16_224"),
                        ("R50+ViT-B/16", "vit_base_r50_s16_224")):
    reference = trained_like_torch(
        timm.create_model(name, pretrained=False, num_classes=1000))
    rows.append((variant, f"timm {name} (erf GELU)",
                 against_torch(reference, variant, images, size, False), None))
    rows.append((variant, "timm, but our model with tanh GELU",
                 against_torch(reference, variant, images, size, True), None))
  from transformers import ViTConfig  # pylint: disable=g-import-not-at-top
  from transformers import ViTForImageClassification  # pylint: disable=g-import-not-at-top
  hf = trained_like_torch(
      ViTForImageClassification(ViTConfig(image_size=size, num_labels=1000)))
  rows.append(("ViT-B/16", "Hugging Face ViTForImageClassification (erf)",
               against_torch(hf, "ViT-B/16", images, size, False), None))
  print(f"{'model':<14} {'against':<46} {'max |dlogit|':>12}")
  for variant, against, error, scale in rows:
    extra = f"  (max |logit| {scale:.2f})" if scale else ""
    print(f"{variant:<14} {against:<46} {error:12.2e}{extra}")


if __name__ == "__main__":
  main()
