"""The benchmark-input command: the input pipeline alone, training images/s
on this host's CPUs (`vit_jax/data/throughput.py`).

    vit-jax benchmark-input --config=configs/digits.py \
        --config.dataset=folder:/data/pets --config.image_size=224 \
        --config.pp_train='inception_crop|flip_lr|value_range' --batches=50

Prints one JSON line (images/s, batch, cores). If this is well above the
model's training images/s, the step never waits on the host.

    vit-jax benchmark-input --listing=2000x500 [--listing_root=DIR]

times instead the listing of an image folder of 2,000 classes x 500 (empty)
files, built in DIR (a temporary folder by default; reused if it exists).
"""

import json

from absl import flags
from ml_collections import config_flags

from vit_jax import cli
from vit_jax.data import throughput
from vit_jax.errors import UserError

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_integer("batches", 50, "Batches to time after two warm-up ones.",
                     lower_bound=1)
flags.DEFINE_string("listing", None,
                    "CLASSESxFILES: time the listing of such a folder.")
flags.DEFINE_string("listing_root", None, "Where to build that folder.")


def main(argv):
  del argv
  if FLAGS.listing:
    print(
        json.dumps(throughput.measure_listing(FLAGS.listing,
                                              FLAGS.listing_root)))
  elif FLAGS.config is None:
    raise UserError("Pass --config=FILE.py (the pipeline to time) or "
                    "--listing=CLASSESxFILES.")
  else:
    print(json.dumps(throughput.measure(FLAGS.config, FLAGS.batches)))


if __name__ == "__main__":
  cli.run(main)
