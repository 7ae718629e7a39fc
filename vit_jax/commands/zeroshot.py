r"""The zeroshot command: an image-text model's zero-shot accuracy on a
labelled dataset, and its image<->text recall where the dataset has
captions (`vit_jax/evaluators/image_text.py`, what training evaluates).

    vit-jax zeroshot --checkpoint=workdirs/siglip --dataset=digits_captions
    vit-jax zeroshot --checkpoint=siglip_b16.npz --tokenizer=c4_en.model \
        --dataset=imagenet2012 --split=validation --templates=clip

(or `python -m vit_jax zeroshot ...`). The checkpoint is a run's workdir,
big_vision's two-tower .npz or a transformers SiglipModel directory
(`vit_jax/inference/zero_shot.py`); a file ships no tokenizer (--tokenizer).
Class names: --class_names (a file, one per line, or a comma-separated
list), else the dataset's (ImageNet's readable names for imagenet2012).
Prompts: --templates (a file of templates, each with one {}), `clip` (CLIP's
80 ImageNet templates, shipped), else the run's own or CLIP's short set.
Retrieval runs where the dataset has the config's text feature
(config.text.key). One process, its devices.
"""

from absl import flags

from vit_jax import cli
from vit_jax.errors import UserError
from vit_jax.inference import zero_shot

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "checkpoint", None, "The image-text model: a workdir, a "
    "two-tower .npz, a SiglipModel directory.")
flags.DEFINE_string(
    "tokenizer", None, "SentencePiece .model or tokenizer."
    "json (default: the run's own).")
flags.DEFINE_string(
    "dataset", None, "A TFDS name, digits_captions, ... "
    "(default: the run's).")
flags.DEFINE_string("split", None, "Default: the run's evaluation split.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir.")
flags.DEFINE_string(
    "class_names", None, "A file (one per line) or a "
    "comma-separated list, in label order.")
flags.DEFINE_string(
    "templates", None, "A file of prompt templates (one per "
    "line, each with {}), or `clip` (CLIP's 80).")
flags.DEFINE_integer("batch_size", 128, "Images per batch.", lower_bound=1)
flags.DEFINE_integer("image_size", None, "Resolution (default: the "
                     "checkpoint's).", lower_bound=1)
flags.mark_flags_as_required(["checkpoint"])


def main(argv):
  del argv
  loaded = zero_shot.load(FLAGS.checkpoint, FLAGS.tokenizer, FLAGS.image_size)
  if not (FLAGS.dataset or loaded.trained_here):
    raise UserError(f"{FLAGS.checkpoint} names no dataset: give --dataset.")
  metrics = zero_shot.evaluate(
      loaded, FLAGS.dataset, FLAGS.split, FLAGS.data_dir,
      zero_shot.lines_or_list(FLAGS.class_names),
      zero_shot.templates_of(FLAGS.templates), FLAGS.batch_size)
  print(" ".join(f"{k}={v:g}" for k, v in sorted(metrics.items())))
  return 0


if __name__ == "__main__":
  cli.run(main)
