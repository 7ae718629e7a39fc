"""Measures the input pipeline alone: training images/s on this host's CPUs.

    python -m vit_jax.data.benchmark --config=configs/digits.py \
        --config.dataset=folder:/data/pets --config.image_size=224 \
        --config.pp_train='inception_crop|flip_lr|value_range' --batches=50

Prints one JSON line (images/s, batch, cores). If this is well above the
model's training images/s, the step never waits on the host.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from vit_jax.data import input_pipeline  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_integer("batches", 50, "Batches to time after two warm-up ones.")
flags.mark_flags_as_required(["config"])


def measure(config, num_batches: int) -> dict:
  source = input_pipeline.make_source(config)
  batches = input_pipeline.make_train_iterator(config, source)
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


def main(argv):
  del argv
  print(json.dumps(measure(FLAGS.config, FLAGS.batches)))


if __name__ == "__main__":
  app.run(main)
