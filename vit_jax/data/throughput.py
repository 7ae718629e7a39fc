"""How fast the input pipeline alone runs on this host's CPUs: training
images/s, the seconds to the first batch of a run started (or resumed) at a
step, and the time to list an image folder (`vit-jax benchmark-input`).
"""

import os
import tempfile
import time

from vit_jax.config import imports
from vit_jax.data import image_folder
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.errors import UserError


def measure(config, num_batches: int, start_step: int = 0, data=None,
            labels: bool = True) -> dict:
  """Training images/s after two warm-up batches, and the seconds from
  opening the source to the first batch of a run at `start_step`. `data`:
  the training data as its objective reads it (None: the images and
  labels, `specs.training`); `labels`: whether it reads labels."""
  data = data or specs.training(config)
  # Its batches and the two warm-up ones; said before TensorFlow loads.
  input_pipeline.check_start(data, start_step, num_batches + 2)
  # Loading TensorFlow (quietly, as the pipeline does) is not part of the
  # pipeline's start: done first.
  tf = imports.import_quietly("tensorflow")
  imports.import_quietly("tensorflow_datasets")
  tf.constant(0)  # Its runtime, too.
  start = time.perf_counter()
  source = input_pipeline.make_source(data)
  batches = input_pipeline.make_train_iterator(
      data, source, start_step=start_step, labels=labels)
  next(batches)
  first_batch_s = time.perf_counter() - start
  next(batches)  # Warm-up: opening files, filling buffers.
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(batches)
  seconds = time.perf_counter() - start
  batches.close()  # Stops the pipeline's threads.
  images = num_batches * batch["image"].shape[0]
  return {
      "dataset": config.dataset,
      "read_by_index": bool(source.reads_by_index),
      "image_size": config.image_size,
      "pp_train": config.pp_train,
      "batch": int(batch["image"].shape[0]),
      "images_per_sec": images / seconds,
      "start_step": start_step,
      "first_batch_s": first_batch_s,
      "cpu_cores": os.cpu_count()
  }


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
  return {
      "root": root,
      "classes": source.num_classes,
      "files": source.num_examples("train"),
      "listing_s": seconds,
      "cpu_cores": os.cpu_count()
  }
