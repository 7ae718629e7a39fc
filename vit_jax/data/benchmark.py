"""Measures the input pipeline alone: training images/s on this host's CPUs.

    python -m vit_jax.data.benchmark --config=configs/digits.py \
        --config.dataset=folder:/data/pets --config.image_size=224 \
        --config.pp_train='inception_crop|flip_lr|value_range' --batches=50

Prints one JSON line (images/s, batch, cores). If this is well above the
model's training images/s, the step never waits on the host.

    python -m vit_jax.data.benchmark --listing=2000x500 [--listing_root=DIR]

times instead the listing of an image folder of 2,000 classes x 500 (empty)
files, built in DIR (a temporary folder by default; reused if it exists).
"""

import json
import os
import tempfile
import time

from vit_jax import cli  # First: the commands' preamble.

cli.import_tensorflow_quietly()

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from vit_jax.data import image_folder, input_pipeline  # noqa: E402
from vit_jax.errors import UserError  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_integer("batches", 50, "Batches to time after two warm-up ones.")
flags.DEFINE_string("listing", None,
                    "CLASSESxFILES: time the listing of such a folder.")
flags.DEFINE_string("listing_root", None, "Where to build that folder.")


def measure(config, num_batches: int) -> dict:
  source = input_pipeline.make_source(config)
  batches = input_pipeline.make_train_iterator(
      config, source, labels=input_pipeline.reads_labels(config))
  for _ in range(2):  # Warm-up: opening files, filling the shuffle buffer.
    next(batches)
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(batches)
  seconds = time.perf_counter() - start
  images = num_batches * batch["image"].shape[0]
  return {"dataset": config.dataset, "image_size": config.image_size,
          "pp_train": config.pp_train, "batch": int(batch["image"].shape[0]),
          "images_per_sec": images / seconds, "cpu_cores": os.cpu_count()}


def build_tree(root: str, classes: int, files: int):
  """ROOT/train/class_<c>/<i>.jpg (numbered with five digits), empty files:
  for timing the listing only."""
  for c in range(classes):
    class_dir = os.path.join(root, "train", f"class_{c:05d}")
    if os.path.isdir(class_dir):
      continue
    os.makedirs(class_dir)
    for i in range(files):
      open(os.path.join(class_dir, f"{i:05d}.jpg"), "wb").close()


def measure_listing(spec: str, root=None) -> dict:
  try:
    classes, files = (int(n) for n in spec.lower().split("x"))
  except ValueError as e:
    raise UserError(f"--listing={spec!r} is not CLASSESxFILES, e.g. "
                    "2000x500.") from e
  root = root or os.path.join(tempfile.gettempdir(),
                              f"vit_jax_listing_{classes}x{files}")
  build_tree(root, classes, files)
  start = time.perf_counter()
  source = image_folder.ImageFolderSource(root)
  seconds = time.perf_counter() - start
  return {"root": root, "classes": source.num_classes,
          "files": source.num_examples("train"), "listing_s": seconds,
          "cpu_cores": os.cpu_count()}


def main(argv):
  del argv
  if FLAGS.listing:
    print(json.dumps(measure_listing(FLAGS.listing, FLAGS.listing_root)))
  elif FLAGS.config is None:
    raise UserError("Pass --config=FILE.py (the pipeline to time) or "
                    "--listing=CLASSESxFILES.")
  else:
    print(json.dumps(measure(FLAGS.config, FLAGS.batches)))


if __name__ == "__main__":
  cli.run(main)
