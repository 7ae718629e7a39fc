r"""Square images, NaFlex's padded sequences and NaViT's packing, side by side.

    .venv/bin/python -m benchmarks.naflex_packing --seconds=90 \
        --out=/tmp/naflex_packing.json

On digits and on digits at mixed sizes and aspect ratios (an image folder
written first, `tests/helpers/mixed_shapes.py`), the `digits` model (4
layers, 64 wide, patch 4) trains from scratch as:

  square      16 x 16 px (16 patches), inception crop
  naflex      each image at its own shape, at most 16 patches, padded to 16
  naflex-res  at a resolution drawn per image (4 to 16 patches), padded
  packed      the same resolutions, packed 64 tokens to a sequence

First each runs 60 steps to measure its images/s; then each trains for
the steps that take `--seconds` at that speed, and is evaluated at its own
evaluation pipeline (square: resized; the others: at most 16 patches,
padded). Reported: images/s (median of the logged steps after the first
20), the padding share of its tokens, test accuracy, and the wall time of
the training run. Each run is a `vit-jax train` process.
"""

import json
import os
import pathlib
import re
import sys
import tempfile

from absl import app
from absl import flags

from benchmarks import train_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_EVAL = "resize_to_sequence|value_range|patchify"
MODES = {
    "square": [
        "--config.pp_train=inception_crop(0.5)|value_range",
        "--config.pp_eval=resize|value_range"
    ],
    "naflex": [
        "--config.sequence_length=16", "--config.pp_train=aspect_crop(0.5)|"
        "resize_to_sequence|value_range|patchify",
        f"--config.pp_eval={SEQ_EVAL}"
    ],
    "naflex-res": [
        "--config.sequence_length=16",
        "--config.pp_train=aspect_crop(0.5)|resize_to_random_sequence(4)|"
        "value_range|patchify", f"--config.pp_eval={SEQ_EVAL}"
    ],
    "packed": [
        "--config.sequence_length=16",
        "--config.pp_train=aspect_crop(0.5)|resize_to_random_sequence(4)|"
        "value_range|patchify", f"--config.pp_eval={SEQ_EVAL}",
        "--config.packing.length=64", "--config.packing.sequences=12",
        "--config.packing.max_images=16"
    ],
}
FLAGS = flags.FLAGS
flags.DEFINE_float("seconds", 90, "Training time each mode gets.")
flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir with digits.")


def _train(workdir, dataset, mode, steps, data_dir):
  run = train_run.train([
      "--config=configs/digits.py", f"--workdir={workdir}",
      f"--config.dataset={dataset}", f"--config.total_steps={steps}",
      "--config.log_every_steps=5", "--config.eval_every_steps=0",
      "--config.model.classifier=gap", "--config.checkpoint_every_steps=100000",
      *MODES[mode]
  ], data_dir)
  packing = re.search(r"Packing: ([\d.]+)% of the packed tokens padding",
                      run.log)
  return {
      "images_per_s": run.images_per_s(skip=4),
      "accuracy": run.metric("test/accuracy"),
      "wall_s": run.wall_s,
      "packing_padding": float(packing.group(1)) / 100 if packing else None,
  }


def _padding_share(dataset, mode, data_dir) -> float:
  """The share of padding tokens of the sequences a mode's training
  pipeline gives (one per image), over 2,000 images."""
  if mode == "square":
    return 0.0
  from configs import digits  # pylint: disable=g-import-not-at-top
  from vit_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.data import specs  # pylint: disable=g-import-not-at-top
  config = digits.get_config().unlock()
  config.dataset, config.data_dir = dataset, data_dir
  config.model.classifier = "gap"
  for flag in MODES[mode]:
    field, value = flag[len("--config."):].split("=", 1)
    if not field.startswith("packing."):
      setattr(config, field, int(value) if value.isdigit() else value)
  spec = specs.training(config)
  source = input_pipeline.make_source(spec)
  valid = total = 0
  for i, batch in enumerate(input_pipeline.make_train_iterator(spec, source)):
    segments = batch["image"]["segments"]
    valid, total = valid + (segments > 0).sum(), total + segments.size
    if i * len(segments) >= 2000:
      break
  return float(1 - valid / total)


def main(argv):
  del argv
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    sys.path.insert(0, REPO)
    from tests.helpers import mixed_shapes  # pylint: disable=g-import-not-at-top
    folder = pathlib.Path(tmp) / "mixed"
    mixed_shapes.write(folder, FLAGS.data_dir)
    for dataset in ("digits", f"folder:{folder}"):
      name = "digits" if dataset == "digits" else "mixed shapes"
      for mode in MODES:
        probe = _train(f"{tmp}/probe-{mode}-{len(results)}", dataset, mode, 60,
                       FLAGS.data_dir)
        steps = max(60, int(FLAGS.seconds * probe["images_per_s"] / 64))
        run = _train(f"{tmp}/run-{mode}-{len(results)}", dataset, mode, steps,
                     FLAGS.data_dir)
        run.update(steps=steps, padding=_padding_share(dataset, mode,
                                                       FLAGS.data_dir))
        results[f"{name}/{mode}"] = run
        print(
            f"{name:12s} {mode:10s} {run['images_per_s']:7.0f} img/s "
            f"padding {run['packing_padding'] or run['padding']:.1%} "
            f"acc {run['accuracy']:.4f} in {steps} steps, "
            f"{run['wall_s']} s", flush=True)
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
