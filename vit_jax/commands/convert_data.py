"""The convert-data command: a TFDS dataset stored as TFRecord files
rewritten in place as ArrayRecord, read by index
(`vit_jax/data/to_array_record.py`).

    vit-jax convert-data --dataset=imagenet2012 --data_dir=~/tensorflow_datasets

Training on a TFRecord dataset works, but reads its files in sequence: a
resume skips through up to an epoch of records, and the console names this
command. Prints one JSON line (shards converted, records).
"""

import json

from absl import flags

from vit_jax import cli
from vit_jax.data import sources
from vit_jax.data import to_array_record
from vit_jax.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string("dataset", None, "The TFDS name (NAME or NAME/CONFIG).")
flags.DEFINE_string(
    "data_dir", None,
    "Its TFDS data_dir (default: TFDS's, ~/tensorflow_datasets).")


def main(argv):
  del argv
  if not FLAGS.dataset:
    raise UserError("Pass --dataset=NAME (a prepared TFDS dataset) and its "
                    "--data_dir.")
  try:
    builder = sources._builder(FLAGS.dataset, FLAGS.data_dir)  # pylint: disable=protected-access
  except UserError:  # Already one line (an unknown name, damaged metadata).
    raise
  except Exception as e:  # pylint: disable=broad-except  # TFDS's many kinds.
    raise UserError(f"No TFDS dataset {FLAGS.dataset!r}: "
                    f"{str(e).splitlines()[0]}") from e
  if not builder.is_prepared():
    raise UserError(
        f"{FLAGS.dataset} is not prepared in {builder.data_dir_root}"
        "; nothing to convert (vit-jax train prepares new "
        "datasets as ArrayRecord already).")
  print(json.dumps(to_array_record.convert(builder)))


if __name__ == "__main__":
  cli.run(main)
