r"""The predict command: the top classes of image files, by any checkpoint
(`vit_jax/inference.py`).

    vit-jax predict --checkpoint=workdirs/demo/finetune docs/digits \
        --top_k=3 --out=preds.csv

(or `python -m vit_jax predict ...`). PATHs are image files or folders
(searched recursively for .jpg, .jpeg and .png; any size, grey or RGB).
Each is preprocessed with the config's evaluation pipeline at the
checkpoint's resolution (see `vit_jax/inference.py`), batches are split over
all local devices, and a table of the top-k classes with their
probabilities is printed; `--out` writes it as CSV. A file that cannot be
read is named and skipped; the command then exits with status 1.
"""

import csv
import io
import os
import time

from absl import app
from absl import flags

from vit_jax import cli
from vit_jax import console
from vit_jax import inference
from vit_jax import paths
from vit_jax.data import image_files

FLAGS = flags.FLAGS
cli.define_checkpoint_flags("to predict with, with a classification head")
flags.DEFINE_integer("top_k", 5, "Classes shown per image.", lower_bound=1)
flags.DEFINE_string("out", None, "Also write the predictions as CSV here.")
flags.DEFINE_string("labels", None, "Class names, one per line.")
flags.DEFINE_integer("batch_size", 64, "Images per batch (over all devices).",
                     lower_bound=1)
flags.DEFINE_integer(
    "sequence_length", None, "Each image at its own shape, resized to at "
    "most this many patches (NaFlex; any plain ViT). Default: the "
    "checkpoint's (a NaFlex file: as many as its position table; others: "
    "square images).", lower_bound=1)


def _shown(path: str) -> str:
  """Local paths relative to the working directory when inside it."""
  relative = os.path.relpath(path) if not paths.is_remote(path) else path
  return path if relative.startswith("..") else relative


def format_table(rows, names) -> str:
  width = max(len(_shown(path)) for path, _, _ in rows)
  return "\n".join(
      f"{_shown(path):<{width}}  " + "  ".join(f"{names[c]} {100 * p:5.1f}%"
                                               for c, p in zip(classes, probs))
      for path, classes, probs in rows)


def to_csv(rows, names) -> str:
  """path,label,score (the top class), then label_i,score_i for each of
  the top k."""
  k = len(rows[0][1]) if rows else 0
  out = io.StringIO()
  writer = csv.writer(out)
  writer.writerow(
      ["path", "label", "score"] +
      [f"{field}_{i}" for i in range(1, k + 1) for field in ("label", "score")])
  for path, classes, probs in rows:
    top = [(names[c], f"{p:.6f}") for c, p in zip(classes, probs)]
    writer.writerow([path, *top[0]] + [x for pair in top for x in pair])
  return out.getvalue()


def main(argv):
  if FLAGS.top_k < 1 or FLAGS.batch_size < 1:
    raise app.UsageError("--top_k and --batch_size must be positive.")
  files = image_files.find_images(argv[1:])
  loaded = inference.load(FLAGS.checkpoint, FLAGS.config, FLAGS.image_size,
                          FLAGS.num_heads, FLAGS.sequence_length)
  names, source = inference.class_names(loaded, FLAGS.labels)
  batch_size = loaded.batch_size(FLAGS.batch_size)
  console.say("Predicting %d file%s with %s (%s; class names: %s).", len(files),
              "" if len(files) == 1 else "s", loaded.checkpoint,
              inference.describe(loaded), source)
  batches = image_files.ImageFiles(files, loaded.config.pp_eval,
                                   loaded.config.image_size, batch_size,
                                   loaded.stride, loaded.config.sequence_length)
  start = time.perf_counter()
  rows = inference.predict(loaded, batches, files, FLAGS.top_k)
  seconds = time.perf_counter() - start
  if rows:
    print(format_table(rows, names))
  rate = len(rows) / max(seconds, 1e-9)
  console.say(
      "Predicted %d image%s in %.1f s (%.*f images/s, reading and "
      "compiling included).", len(rows), "" if len(rows) == 1 else "s", seconds,
      1 if rate < 10 else 0, rate)
  if FLAGS.out:
    paths.resolve(FLAGS.out).write_text(to_csv(rows, names))
    console.say("Wrote %d predictions to %s.", len(rows), FLAGS.out)
  for path, why in batches.failed:
    console.say("Skipped %s: %s", _shown(path), why)
  if batches.failed:
    console.say(
        "%d of %d files could not be read (named above) and were "
        "skipped; the others were predicted.", len(batches.failed), len(files))
    return 1
  return 0


if __name__ == "__main__":
  cli.run(main)
