r"""MAE's step against full-sequence steps of the same model, in one process.

    .venv/bin/python -m benchmarks.mae_speed --variant=ViT-B/16 --batch=8 \
        --out=/tmp/mae_speed.json

Two measurements of the same ViT (random init, 224 px, synthetic images):

  encoder    its forward and backward pass (the gradient of its outputs'
             sum) on the visible patches MAE keeps (25% of them and the
             class token, a patch sequence) against the whole image;
  steps      `vit-jax benchmark`'s train step (`performance/speed.py`) for
             config.objective=mae (MAE's 512-wide 8-block decoder),
             masked_patch (the paper's: every patch encoded) and
             supervised, each the median of `--steps` timed steps.

Each is reported in images/s with the ratio to the full sequence's. On a
CPU, run it with nothing beside it: the ratios hold across sittings, the
absolute figures do not.
"""

import json
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.models import mae
from vit_jax.performance import speed

FLAGS = flags.FLAGS
flags.DEFINE_string("variant", "ViT-B/16", "Model variant.")
flags.DEFINE_integer("batch", 8, "Images per step.")
flags.DEFINE_integer("image_size", 224, "Input resolution.")
flags.DEFINE_integer("steps", 5, "Timed steps (after one warm-up).")
flags.DEFINE_float("mask_ratio", 0.75, "MAE's share of patches dropped.")
flags.DEFINE_string("out", None, "Write the results as JSON here.")


def _median_seconds(fn, *args) -> float:
  jax.block_until_ready(fn(*args))  # Compile and warm up.
  times = []
  for _ in range(FLAGS.steps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def encoder_speeds() -> dict:
  """Images/s of the ViT's forward and backward pass on MAE's visible
  patches and on the whole image."""
  vit = models.create_model(FLAGS.variant, None, gelu_approximate=True)
  rng = np.random.default_rng(0)
  size = FLAGS.image_size
  images = jnp.asarray(rng.uniform(-1, 1, (FLAGS.batch, size, size, 3)),
                       jnp.float32)
  patch = vit.size.patch_size
  num_patches = (size // patch)**2
  masking = mae.sample_masking(jax.random.key(0), FLAGS.batch, num_patches,
                               FLAGS.mask_ratio)
  visible = mae.visible_patches(images, patch, masking)
  params = jax.jit(vit.init)(jax.random.key(1), images)["params"]

  def grad_of(inputs):
    loss = lambda p: vit.apply({"params": p}, inputs)[1]["encoded"].sum()
    return jax.jit(jax.grad(loss))

  out = {}
  for name, inputs in (("visible", visible), ("whole", images)):
    seconds = _median_seconds(grad_of(inputs), params)
    out[name] = {"images_per_s": FLAGS.batch / seconds, "step_s": seconds}
  out["speedup"] = out["visible"]["images_per_s"] / out["whole"]["images_per_s"]
  out["tokens"] = {"visible": masking.keep + 1, "whole": num_patches + 1}
  return out


def step_speeds() -> dict:
  out = {}
  for objective in ("mae", "masked_patch", "supervised"):
    result = speed.run(FLAGS.variant, FLAGS.batch, FLAGS.image_size,
                       num_steps=FLAGS.steps, objective=objective,
                       mae_options=dict(mask_ratio=FLAGS.mask_ratio))
    out[objective] = {
        k: result[k]
        for k in ("images_per_sec", "step_s", "compile_s",
                  "forward_gmacs_per_image", "final_loss", "parameters")
    }
  for objective in ("masked_patch", "supervised"):
    out[f"mae_over_{objective}"] = (out["mae"]["images_per_sec"] /
                                    out[objective]["images_per_sec"])
  return out


def main(argv):
  del argv
  result = {
      "variant": FLAGS.variant,
      "batch": FLAGS.batch,
      "image_size": FLAGS.image_size,
      "mask_ratio": FLAGS.mask_ratio,
      "device": jax.devices()[0].device_kind,
      "jax": jax.__version__,
      "encoder": encoder_speeds(),
      "steps": step_speeds(),
  }
  text = json.dumps(result, indent=1)
  print(text)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  app.run(main)
