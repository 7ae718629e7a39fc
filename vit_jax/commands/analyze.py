r"""The analyze command: the paper's figures of what a ViT learnt
(`vit_jax/analysis/`).

    vit-jax analyze --checkpoint=workdirs/demo/pretrain
    vit-jax analyze --checkpoint=ViT-B_16.npz --images=photos/ --out=fig/

(or `python -m vit_jax analyze ...`). Writes four PNGs into `--out` and
`analysis.json` with the numbers behind them
(`vit_jax/analysis/measures.py` says
how each is computed):

  embedding_filters.png              principal components of the patch
                                     embedding's filters (Fig. 7 left);
  position_embedding_similarity.png  cosine similarity of the position
                                     embeddings (Fig. 7 centre);
  mean_attention_distance.png        per head against depth (Fig. 7 right);
  attention_rollout.png              the output token's attention to the
                                     input, over a few images (Fig. 6);
  mae_reconstructions.png            for a checkpoint with MAE's decoder
                                     (an MAE run, MAE's full files): the
                                     same images masked, predicted and
                                     original (`analysis/reconstructions.py`).

A model without attention or position embeddings (an MLP-Mixer) gets the
figures it has numbers for, and the command says which it has none of;
fixed sincos2d position embeddings are shown as computed.
Attention is averaged over `--num_images` images: the files under
`--images`, or, for a training workdir, the first images of its dataset's
evaluation split. `--out` defaults to `analysis/` in the training workdir
(else in the working directory).
"""

import dataclasses
import json
import os
from typing import Optional

from absl import app
from absl import flags
import numpy as np

from vit_jax import cli
from vit_jax import console
from vit_jax import inference
from vit_jax import models
from vit_jax import paths
from vit_jax import weights
from vit_jax.analysis import figures
from vit_jax.analysis import measures
from vit_jax.analysis import reconstructions
from vit_jax.data import image_files
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.errors import UserError

FLAGS = flags.FLAGS
cli.define_checkpoint_flags("to analyse")
flags.DEFINE_multi_string(
    "images", None, "Image files or folders to "
    "average the attention over (repeat the flag for "
    "more; default, for a training workdir: its "
    "evaluation split).")
flags.DEFINE_integer("num_images", 128, "Images the attention is averaged "
                     "over (at most).", lower_bound=1)
flags.DEFINE_integer("num_shown", 6, "Images in the attention rollout "
                     "figure.", lower_bound=1)
flags.DEFINE_integer(
    "batch_size", 8, "Images per batch (over all devices); "
    "the attention of every layer is kept, so memory grows "
    "with batch x layers x heads x tokens^2.", lower_bound=1)
flags.DEFINE_string("out", None, "Folder for the figures and analysis.json.")
flags.DEFINE_boolean(
    "norm_pix_loss", None, "Whether an MAE decoder predicts normalised pixels "
    "(default: its run's config.mae, else True as MAE's full files; "
    "--nonorm_pix_loss for its mae_visualize files); only for a checkpoint "
    "with MAE's decoder.")

FIGURES = ("embedding_filters.png", "position_embedding_similarity.png",
           "mean_attention_distance.png", "attention_rollout.png")
MAE_FIGURE = "mae_reconstructions.png"


def _eval_split_batches(loaded, batch_size: int):
  """(batches of the training dataset's evaluation split, with the index of
  each image; a name for image i)."""
  if not loaded.trained_here:
    raise UserError(
        f"{loaded.checkpoint} is not a training workdir, so there is no "
        "dataset to take images from: give --images=FILES_OR_FOLDERS.")
  data = specs.evaluation(loaded.config, {"batch_size": batch_size})
  source = sources.make_source(
      data, index_dir=weights.training_workdir(loaded.checkpoint))

  def batches():
    dataset = input_pipeline.numpy_eval_batches(  # One process reads it all.
        data, source, process_index=0, process_count=1, labels=False)
    for number, batch in enumerate(dataset):
      yield dict(batch, index=number * batch_size + np.arange(batch_size))

  split = f"{data.dataset}:{data.split}"
  return batches(), split, lambda i: f"{split} #{i}"


def _output_folder(loaded) -> str:
  if FLAGS.out:
    return FLAGS.out
  if loaded.trained_here:
    return str(weights.training_workdir(loaded.checkpoint) / paths.ANALYSIS_DIR)
  return paths.ANALYSIS_DIR


COPIED_AS_IS = ("variant", "image_size", "grid", "patch_pixels", "num_images")


def to_json(result: dict, images: str, names) -> dict:
  filters = result["embedding_filters"]
  distance = result["mean_attention_distance"]
  by_layer = ([] if distance is None else measures.summary_by_layer(distance))
  return {
      "checkpoint": result["checkpoint"],
      "images": images,
      **{
          k: result[k] for k in COPIED_AS_IS
      },
      "embedding_filters": {
          "layer": filters["layer"],
          "explained_variance_ratio": measures.rounded(
              filters["explained_variance_ratio"]),
          "components": measures.rounded(filters["components"])
      },
      "position_embeddings": result["position_embeddings"],
      "position_embedding_similarity": measures.rounded(
          result["position_embedding_similarity"]),
      "mean_attention_distance": measures.rounded(distance, 3),
      "mean_attention_distance_definition": measures.DISTANCE_DEFINITION,
      "mean_attention_distance_by_layer": [
          dict(zip(("min", "mean", "max"), measures.rounded(np.array(r), 3)))
          for r in by_layer
      ],
      "attention_rollout": [{
          "image": names(shown.index),
          "map": measures.rounded(shown.rollout_map)
      } for shown in result["attention_rollout"]],
      "not_computed": result["not_computed"],
  }


def _draw(result: dict, names, where) -> list[str]:
  """The figures the model has numbers for; returns their file names."""
  filters = result["embedding_filters"]
  figures.embedding_filters(filters["components"],
                            filters["explained_variance_ratio"],
                            filters["layer"], where(FIGURES[0]))
  written = [FIGURES[0]]
  if result["position_embedding_similarity"] is not None:
    figures.position_similarity(result["position_embedding_similarity"],
                                result["grid"], where(FIGURES[1]))
    written.append(FIGURES[1])
  if result["mean_attention_distance"] is not None:
    figures.mean_attention_distance(result["mean_attention_distance"],
                                    result["image_size"], where(FIGURES[2]))
    shown = result["attention_rollout"]
    figures.attention_rollout([(s.image, s.rollout_map) for s in shown],
                              [names(s.index) for s in shown], where(
                                  FIGURES[3]))
    written += FIGURES[2:]
  return written


def _check_norm_pix_loss(loaded, norm_pix_loss: Optional[bool]):
  """--norm_pix_loss (None: not given) says what an MAE decoder predicts:
  refused, before anything is computed, for a checkpoint without one."""
  if norm_pix_loss is None:
    return
  if (isinstance(loaded.model, models.MlpMixer) or
      reconstructions.decoder_of(loaded) is None):
    flag = "--norm_pix_loss" if norm_pix_loss else "--nonorm_pix_loss"
    raise UserError(
        f"{flag} says what an MAE decoder predicts, and {loaded.checkpoint} "
        "has none (its figures are drawn without it): leave the flag out.")


def _reconstructions(loaded, result: dict, names, where) -> Optional[dict]:
  """MAE's reconstructions of the rollout's images, where the checkpoint
  has MAE's decoder; what analysis.json says of them."""
  decoder = reconstructions.decoder_of(loaded, FLAGS.norm_pix_loss)
  if decoder is None:
    return None
  shown = result["attention_rollout"]
  images = np.stack([s.image for s in shown])
  masked, predicted, pasted, loss = reconstructions.reconstruct(
      loaded, decoder, images)
  figures.mae_reconstructions(masked, predicted, pasted,
                              images, [names(s.index) for s in shown],
                              where(MAE_FIGURE), decoder.norm_pix_loss)
  return {
      "mask_ratio": decoder.mask_ratio,
      "norm_pix_loss": decoder.norm_pix_loss,
      "loss": [{
          "image": names(s.index),
          "loss": measures.rounded(float(value))
      } for s, value in zip(shown, loss)]
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}: name images "
                         "with --images=FILES_OR_FOLDERS.")
  if min(FLAGS.num_images, FLAGS.batch_size, FLAGS.num_shown) < 1:
    raise app.UsageError(
        "--num_images, --num_shown and --batch_size must be positive.")
  loaded = inference.load(FLAGS.checkpoint, FLAGS.config, FLAGS.image_size,
                          FLAGS.num_heads)
  _check_norm_pix_loss(loaded, FLAGS.norm_pix_loss)
  if loaded.config.pp_eval.replace(" ", "").endswith("patchify"):
    # The figures are of a square grid: images resized to one (a model of
    # images at their own shape runs on squares too).
    config = loaded.config.copy_and_resolve_references()
    config.pp_eval, config.sequence_length = "resize|value_range", None
    loaded = dataclasses.replace(loaded, config=config)
    console.say("The figures need a square grid: images resized to %d px.",
                config.image_size)
  batch_size = loaded.batch_size(FLAGS.batch_size)
  failed = []
  if FLAGS.images:
    files = image_files.find_images(FLAGS.images)[:FLAGS.num_images]
    reader = image_files.ImageFiles(files, loaded.config.pp_eval,
                                    loaded.config.image_size, batch_size)
    batches, images = reader, ",".join(FLAGS.images)
    names = lambda i: os.path.basename(files[i])
  else:
    batches, images, names = _eval_split_batches(loaded, batch_size)
  console.say(
      "Analysing %s (%s) over at most %d images of %s.", loaded.checkpoint,
      inference.describe(loaded), FLAGS.num_images, images)
  result = measures.run(loaded, batches, FLAGS.num_images, FLAGS.num_shown)
  result["checkpoint"] = loaded.checkpoint
  if FLAGS.images:
    failed = reader.failed

  out = _output_folder(loaded)
  paths.resolve(out).mkdir(parents=True, exist_ok=True)
  where = lambda name: f"{out.rstrip('/')}/{name}"
  written = _draw(result, names, where)
  summary = to_json(result, images, names)
  if result["attention_rollout"]:
    summary["mae_reconstructions"] = _reconstructions(loaded, result, names,
                                                      where)
    if summary["mae_reconstructions"]:
      written.append(MAE_FIGURE)
  paths.resolve(where("analysis.json")).write_text(json.dumps(
      summary, indent=1))

  if result["mean_attention_distance"] is not None:
    console.say(
        "Mean attention distance (pixels; min / mean / max over "
        "heads), over %d images:", result["num_images"])
    for layer, (low, mean, high) in enumerate(
        measures.summary_by_layer(result["mean_attention_distance"]), 1):
      console.say("  layer %2d  %6.2f / %6.2f / %6.2f", layer, low, mean, high)
  for why in result["not_computed"]:
    console.say("Not computed: %s.", why)
  console.say("Wrote %s and analysis.json to %s.", ", ".join(written), out)
  for path, why in failed:
    console.say("Skipped %s: %s", path, why)
  return 1 if failed else 0


if __name__ == "__main__":
  cli.run(main)
