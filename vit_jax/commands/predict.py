r"""The predict command: the top classes of image files, by any checkpoint
(`vit_jax/inference/`).

    vit-jax predict --checkpoint=workdirs/demo/finetune docs/digits \
        --top_k=3 --out=preds.csv

(or `python -m vit_jax predict ...`). PATHs are image files or folders
(searched recursively for .jpg, .jpeg and .png; any size, grey or RGB).
Each is preprocessed with the config's evaluation pipeline at the
checkpoint's resolution (see `vit_jax/inference/`), batches are split over
all local devices, and a table of the top-k classes with their
probabilities is printed; `--out` writes it as CSV. A file that cannot be
read is named and skipped; the command then exits with status 1.

A classifier's classes are named by --labels or --class_names (one name
per class of its head), else by the checkpoint or its training dataset,
else by their indices.

An image-text model (a SigLIP, CLIP or LiT run, a two-tower file, a
transformers SiglipModel directory: `vit_jax/inference/zero_shot.py`) classifies
zero-shot among --class_names, each put in --templates: SigLIP's
probabilities are each name's own sigmoid (they need not sum to 1), CLIP's
a softmax over the names.

    vit-jax predict --checkpoint=workdirs/siglip \
        --class_names=zero,one,two,three,four,five,six,seven,eight,nine \
        docs/digits
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
from vit_jax.errors import UserError
from vit_jax.inference import zero_shot

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
flags.DEFINE_string(
    "class_names", None, "An image-text model's classes: a comma-separated "
    "list or a file (one per line); for a classifier, the names of its "
    "head's classes, in class order (as --labels).")
flags.DEFINE_string(
    "templates", None, "An image-text model's prompts, each with {} for the "
    "class name: a file (one per line), `clip` (CLIP's 80), or none (the "
    "run's own, else CLIP's short set).")
flags.DEFINE_string(
    "tokenizer", None, "An image-text file's tokenizer "
    "(SentencePiece .model or tokenizer.json).")


def _zero_shot(files):
  """(rows, names, how they were computed, batches) of an image-text
  model's zero-shot prediction among --class_names."""
  from vit_jax.evaluators import image_text  # pylint: disable=g-import-not-at-top
  names = zero_shot.lines_or_list(FLAGS.class_names or FLAGS.labels)
  if not names:
    raise UserError(f"{FLAGS.checkpoint} is an image-text model: it "
                    "classifies among names you give, e.g. --class_names="
                    "cat,dog (or a file, one per line).")
  loaded = zero_shot.load(FLAGS.checkpoint, FLAGS.tokenizer, FLAGS.image_size)
  templates = (zero_shot.templates_of(FLAGS.templates) or
               tuple(loaded.config.evals.zeroshot.get("templates", ())) or
               image_text.DEFAULT_TEMPLATES)
  sequence_length = FLAGS.sequence_length or loaded.config.sequence_length
  batches = image_files.ImageFiles(
      files, loaded.config.pp_eval or "resize|value_range",
      loaded.config.image_size, loaded.batch_size(FLAGS.batch_size),
      zero_shot.stride(loaded), sequence_length)
  rows = zero_shot.predict(loaded, batches, files, names, templates,
                           FLAGS.top_k)
  how = (f"zero-shot among {len(names)} names, {len(templates)} "
         f"template{'s' if len(templates) > 1 else ''}")
  return rows, names, how, batches


def _class_names(loaded):
  """(names of the classifier's classes, where they came from):
  --class_names, one per class of its head, else `inference.class_names`
  (--labels, the checkpoint's or the training dataset's own)."""
  if not FLAGS.class_names:
    return inference.class_names(loaded, FLAGS.labels)
  inference.require_head(loaded)
  names = zero_shot.lines_or_list(FLAGS.class_names)
  if len(names) != loaded.num_classes:
    raise UserError(
        f"--class_names names {len(names)} classes, and {FLAGS.checkpoint}'s "
        f"head has {loaded.num_classes}: name each of its classes, in class "
        "order, or leave the flag out (its own names, else the indices, are "
        "shown).")
  return list(names), "--class_names"


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
  if FLAGS.class_names and FLAGS.labels:
    raise UserError("--class_names and --labels both name the classes: give "
                    "one of them.")
  files = image_files.find_images(argv[1:])
  if zero_shot.is_two_towers(FLAGS.checkpoint):
    start = time.perf_counter()
    rows, names, how, batches = _zero_shot(files)
    console.say("Predicted %d images with %s (%s) in %.1f s.", len(rows),
                FLAGS.checkpoint, how,
                time.perf_counter() - start)
    return _report(rows, names, batches, files)
  loaded = inference.load(FLAGS.checkpoint, FLAGS.config, FLAGS.image_size,
                          FLAGS.num_heads, FLAGS.sequence_length)
  names, source = _class_names(loaded)
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
  rate = len(rows) / max(seconds, 1e-9)
  console.say(
      "Predicted %d image%s in %.1f s (%.*f images/s, reading and "
      "compiling included).", len(rows), "" if len(rows) == 1 else "s", seconds,
      1 if rate < 10 else 0, rate)
  return _report(rows, names, batches, files)


def _report(rows, names, batches, files) -> int:
  """Prints (and writes) the table; says what could not be read."""
  if rows:
    print(format_table(rows, names))
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
