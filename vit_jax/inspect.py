"""Prints a weights file's parameters, and how they fit a config's model.

    vit-jax inspect /tmp/digits.npz
    vit-jax inspect /tmp/digits.npz --config=configs/finetune.py:digits
    vit-jax inspect ViT-B/16@i21k        # a released checkpoint, by name
    vit-jax inspect --list_released      # the names

(or `python -m vit_jax.inspect ...`). Without --config: every array in the
file (name, shape, dtype) and the total count. With a config: the table of
matching, resized, re-initialised, dropped, missing and unexpected
parameters that loading it for that config would give (the number of
classes is the file's head's unless --num_classes says otherwise). Reads any
format, URL or released name the loader reads.
"""

from vit_jax import cli  # First: the commands' preamble.

from absl import app, flags
import numpy as np
from ml_collections import config_flags

from vit_jax import models, steps, weights
from vit_jax.weights import formats, released

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Target config (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_integer("num_classes", None, "Classes of the target's head.")
flags.DEFINE_bool("list_released", False, "Print the names of the released "
                  "checkpoints (and their URLs) instead.")


def describe_file(path: str, cache_dir=None) -> str:
  fmt, tensors = formats.read(path, cache_dir)
  width = max(len(k) for k in tensors)
  rows = [f"{path}: {fmt}, {len(tensors)} arrays, "
          f"{sum(v.size for v in tensors.values()):,} parameters"]
  rows += [f"  {name:<{width}}  {str(tuple(v.shape)):<20} {v.dtype}"
           for name, v in sorted(tensors.items())]
  return "\n".join(rows)


def compare_with_config(path: str, config, num_classes=None) -> str:
  """The loader's report for `config`'s model; raises only for a released
  name of another variant (before downloading it)."""
  weights.loader.check_released_variant(path, config.model.variant)
  config = config.copy_and_resolve_references()
  config.init.checkpoint = path
  config = weights.resolve_gelu(config)
  if num_classes is None:
    head = weights.loader.read_converted(
        path, models.get_variant(config.model.variant).num_heads,
        config.init.cache_dir).params.get("head/kernel")
    num_classes = head.shape[-1] if head is not None else 1000
  model = steps.model_for_config(config, num_classes)
  size = config.image_size
  target = models.param_shapes(model, size)
  what = (f"{num_classes} classes" if model.num_classes else
          f"config.objective={config.objective}")
  try:
    _, report = weights.load_for_config(config, path, target)
    return (f"Loads into {config.model.variant} at {size} px with "
            f"{what}:\n{report.table(limit=1000)}")
  except weights.WeightsError as e:
    return f"Does NOT load into {config.model.variant} at {size} px:\n{e}"


def report(path: str, config=None, num_classes=None) -> str:
  """The file's arrays, then with `config` how they load into its model."""
  if config is None:
    return describe_file(path)
  # Before `describe_file` downloads a released name.
  weights.loader.check_released_variant(path, config.model.variant)
  return "\n".join([describe_file(path, config.init.cache_dir),
                    compare_with_config(path, config, num_classes)])


def main(argv):
  if FLAGS.list_released:
    print(released.describe_table())
    return
  if len(argv) != 2:
    raise app.UsageError("Usage: vit-jax inspect PATH [--config=...]")
  np.set_printoptions(linewidth=120)
  print(report(argv[1], FLAGS.config, FLAGS.num_classes))


if __name__ == "__main__":
  cli.run(main)
