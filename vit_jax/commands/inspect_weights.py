"""The inspect command: a weights file's parameters, and how they fit a
config's model (`vit_jax/weights/describe.py`).

    vit-jax inspect /tmp/digits.npz
    vit-jax inspect /tmp/digits.npz --config=configs/finetune.py:digits
    vit-jax inspect ViT-B/16@i21k        # a released checkpoint, by name
    vit-jax inspect --list_released      # the names
    vit-jax inspect /tmp/model.safetensors --num_heads=6  # heads not stored

(or `python -m vit_jax inspect ...`). It prints the array count, the
model the file holds and the config fields that build it (or why the file
alone cannot say; a PyTorch file does not store its attention heads: those
of the variants of its width are assumed, or --num_heads), then every
array (name, shape, dtype). With a config, also the table of
matching, resized, re-initialised, dropped, missing and unexpected
parameters that loading it for that config would give (the number of
classes is the file's head's unless --num_classes says otherwise). Reads any
format, URL or released name the loader reads.
"""

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from vit_jax import cli
from vit_jax import objectives
from vit_jax import weights
from vit_jax.config import imports

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Target config (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_integer("num_classes", None, "Classes of the target's head.",
                     lower_bound=1)
flags.DEFINE_integer(
    "num_heads", None, "Attention heads of a PyTorch file's model (its "
    "weights do not say; default: those of the variants of its width).",
    lower_bound=1)
flags.DEFINE_bool(
    "list_released", False, "Print the names of the released "
    "checkpoints (and their URLs) instead.")


def main(argv):
  if FLAGS.list_released:
    print(weights.released_table())
    return
  if len(argv) != 2:
    raise app.UsageError("Usage: vit-jax inspect PATH [--config=...]")
  np.set_printoptions(linewidth=120)
  objective = None
  if FLAGS.config is not None:
    imports.load(FLAGS.config)  # A user's objective is registered by then.
    objective = objectives.of(FLAGS.config)
  print(
      weights.describe_weights(argv[1], FLAGS.config, FLAGS.num_classes,
                               FLAGS.num_heads, objective))


if __name__ == "__main__":
  cli.run(main)
