"""The benchmark command: train-step speed on synthetic data
(`vit_jax/performance/speed.py`).

    vit-jax benchmark --variant=ViT-B/16 --batch=256 --dtype=bfloat16 \
        --out=bench.json

Needs only jax/flax/optax (no TensorFlow), so it runs on any accelerator
host. Every speed candidate of benchmarks/gpu_sweep.sh is a flag: XLA's
options (`--xla_options`, given to this step's compilation alone), the
optimizer's first moment in bf16 (`--mu_dtype`), remat, batch, attention,
the GELU form, FP8 and ViT-22B's block options.
"""

import json

from absl import flags

from vit_jax import cli
from vit_jax.config import model_form
from vit_jax.performance import speed
from vit_jax.training import optim

flags.DEFINE_string("variant", "ViT-B/16", "Model variant.")
flags.DEFINE_integer("batch", 32, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("image_size", 224, "Input resolution.", lower_bound=1)
flags.DEFINE_integer("num_classes", 1000, "Classes of the head.", lower_bound=1)
flags.DEFINE_integer("steps", 10, "Timed steps (after one warm-up step).",
                     lower_bound=1)


def _define_model_flags():
  """A flag per field of the form that `vit-jax benchmark` sets
  (`model_form.benchmark_fields`: dtype, remat, scan, attention, FP8, the
  GELU form, ViT-22B's block options), with its default and choices."""
  defaults = model_form.defaults()
  for name in model_form.benchmark_fields():
    words = f"config.model.{name} (vit_jax/config/model_form.py)."
    if isinstance(defaults[name], bool):
      flags.DEFINE_bool(name, defaults[name], words)
    else:
      flags.DEFINE_enum(name, defaults[name], model_form.choices(name), words)


_define_model_flags()
flags.DEFINE_enum("mu_dtype", "float32", list(optim.MOMENTUM_DTYPES),
                  "Adam's first moment (config.mu_dtype).")
flags.DEFINE_string(
    "xla_options", "", "XLA options of the compiled step, NAME=VALUE,... "
    "(e.g. xla_gpu_enable_triton_gemm=false); JAX's compiler_options.")
flags.DEFINE_integer(
    "profile_steps", 0, "Also trace this many steps and "
    "report where the device time goes.", lower_bound=0)
flags.DEFINE_float("peak_tflops", None, "Peak TFLOP/s per device for MFU.")
flags.DEFINE_enum(
    "objective", "supervised", speed.benchmarked_objectives(),
    "What the step trains: supervised, masked_patch, or mae "
    "(its encoder on the visible patches).")
flags.DEFINE_float("mask_ratio", 0.75, "MAE's share of patches dropped.")
flags.DEFINE_string("out", None, "Write the JSON result here as well.")
cli.check_flag("peak_tflops", lambda tflops: tflops > 0,
               "give the device's peak TFLOP/s, a positive number.")


def main(argv):
  del argv
  f = flags.FLAGS
  model_options = {
      name: f[name].value for name in model_form.benchmark_fields()
  }
  result = speed.run(f.variant, f.batch, f.image_size, f.num_classes, f.steps,
                     model_options, mu_dtype=f.mu_dtype,
                     peak_tflops=f.peak_tflops, profile_steps=f.profile_steps,
                     compiler_options=speed.xla_options(
                         f.xla_options), objective=f.objective,
                     mae_options=dict(mask_ratio=f.mask_ratio))
  text = json.dumps(result, indent=2)
  print(text)
  if f.out:
    with open(f.out, "w") as out:
      out.write(text + "\n")


if __name__ == "__main__":
  cli.run(main)
