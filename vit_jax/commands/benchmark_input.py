"""The benchmark-input command: the input pipeline alone, training images/s
on this host's CPUs (`vit_jax/data/throughput.py`).

    vit-jax benchmark-input --config=configs/digits.py \
        --config.dataset=folder:/data/pets --config.image_size=224 \
        --config.pp_train='inception_crop|flip_lr|value_range' --batches=50

Prints one JSON line (images/s, batch, cores, and the seconds to the first
batch). If this is well above the model's training images/s, the step never
waits on the host. `--start_step=N` starts the stream at step N, as a
resumed run does: on records read by index its first batch comes as soon as
at step 0.

    vit-jax benchmark-input --config=configs/digits.py --synthetic=100k \
        --config.data_dir=/tmp/synthetic --config.image_size=224 \
        --config.pp_train='inception_crop|flip_lr|value_range' \
        --config.batch_size=256 --start_step=351

reads `synthetic_images/100k` (`vit_jax/data/synthetic.py`: 100,000
256x256 JPEGs), prepared first in config.data_dir in --file_format
(ArrayRecord, or TFRecord to time the files read in sequence).

    vit-jax benchmark-input --listing=2000x500 [--listing_root=DIR]

times instead the listing of an image folder of 2,000 classes x 500 (empty)
files, built in DIR (a temporary folder by default; reused if it exists).
"""

import json

from absl import flags
from ml_collections import config_flags

from vit_jax import cli
from vit_jax import objectives
from vit_jax.config import imports
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
flags.DEFINE_integer("start_step", 0, "Start the stream at this step.",
                     lower_bound=0)
flags.DEFINE_enum("synthetic", None, ["100k", "tiny"],
                  "Read synthetic_images/THIS, prepared first if need be.")
flags.DEFINE_enum("file_format", "array_record", ["array_record", "tfrecord"],
                  "The files --synthetic is prepared in.")


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
    config = FLAGS.config
    if FLAGS.synthetic:
      from vit_jax.data import synthetic  # pylint: disable=g-import-not-at-top
      config = config.copy_and_resolve_references()
      config.dataset = synthetic.prepare(FLAGS.synthetic, config.data_dir,
                                         FLAGS.file_format)
    imports.load(config)  # A user's objective is registered by then.
    objective = objectives.of(config)
    print(
        json.dumps(
            throughput.measure(config, FLAGS.batches, FLAGS.start_step,
                               data=objectives.training_data(config),
                               labels=objective.carries(config).labels)))


if __name__ == "__main__":
  cli.run(main)
