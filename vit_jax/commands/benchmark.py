"""The benchmark command: train-step speed on synthetic data
(`vit_jax/performance/speed.py`).

    vit-jax benchmark --variant=ViT-B/16 --batch=256 --dtype=bfloat16 \
        --out=bench.json

Needs only jax/flax/optax (no TensorFlow), so it runs on any accelerator
host.
"""

import json

from absl import flags

from vit_jax import cli
from vit_jax import models
from vit_jax.performance import speed

flags.DEFINE_string("variant", "ViT-B/16", "Model variant.")
flags.DEFINE_integer("batch", 32, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("image_size", 224, "Input resolution.", lower_bound=1)
flags.DEFINE_integer("num_classes", 1000, "Classes of the head.", lower_bound=1)
flags.DEFINE_integer("steps", 10, "Timed steps (after one warm-up step).",
                     lower_bound=1)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
flags.DEFINE_enum("remat", "none", ["none", "full", "dots"], "Remat policy.")
flags.DEFINE_bool("scan_layers", False, "Scan over the encoder blocks.")
flags.DEFINE_bool("fp8", False, "The encoder's matmuls in FP8 "
                  "(config.model.fp8).")
flags.DEFINE_enum("attention", "auto", models.ATTENTION,
                  "Attention implementation (config.model.attention).")
flags.DEFINE_integer(
    "profile_steps", 0, "Also trace this many steps and "
    "report where the device time goes.", lower_bound=0)
flags.DEFINE_float("peak_tflops", None, "Peak TFLOP/s per device for MFU.")
flags.DEFINE_string("out", None, "Write the JSON result here as well.")
cli.check_flag("peak_tflops", lambda tflops: tflops > 0,
               "give the device's peak TFLOP/s, a positive number.")


def main(argv):
  del argv
  f = flags.FLAGS
  result = speed.run(f.variant, f.batch, f.image_size, f.num_classes, f.steps,
                     f.dtype, f.remat, f.scan_layers, f.peak_tflops,
                     f.attention, f.profile_steps, f.fp8)
  text = json.dumps(result, indent=2)
  print(text)
  if f.out:
    with open(f.out, "w") as out:
      out.write(text + "\n")


if __name__ == "__main__":
  cli.run(main)
