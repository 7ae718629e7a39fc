r"""A small ViT taught by a larger one against the same ViT on the labels.

    .venv/bin/python -m benchmarks.distill_digits --seeds=0,1,2 \
        --out=/tmp/distill_digits.json

For each seed, two `vit-jax train` processes on the built-in digits:
configs/distill.py:digits (the `digits-small` student matching the
teacher's predictions, mixup on every example, no labels) and
:digits_labels (the same student, data, steps and schedule on the labels).
`--teacher` replaces the recipe's teacher (configs/teachers/digits.npz);
`--steps` both runs' length; `--share=20` trains both students on the
first 20% of the training images (the recipes' `share`: the teacher,
trained on all of them, then knows more than the students' data shows, as
a fine-tuned large checkpoint does). Reported per run: test accuracy,
the teacher's (distillation runs), their agreement, wall time and
images/s; then the means over the seeds and the distilled student's lead.
"""

import json
import pathlib
import statistics
import tempfile

from absl import app
from absl import flags

from benchmarks import train_run

FLAGS = flags.FLAGS
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (config.seed) to run.")
flags.DEFINE_integer("steps", None, "Steps of both runs (the recipe's: None).")
flags.DEFINE_string("teacher", None, "Another teacher checkpoint.")
flags.DEFINE_integer("share", 100, "Percent of the training images.")
flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir with digits.")


def _train(workdir: str, preset: str, seed: int) -> dict:
  args = [
      f"--config=configs/distill.py:{preset},share={FLAGS.share}",
      f"--workdir={workdir}", f"--config.seed={seed}",
      "--config.eval_every_steps=0", "--config.checkpoint_every_steps=100000"
  ]
  if FLAGS.steps:
    args.append(f"--config.total_steps={FLAGS.steps}")
  if FLAGS.teacher and preset == "digits":
    args.append(f"--config.distill.teachers=('{FLAGS.teacher}',)")
  run = train_run.train(args, FLAGS.data_dir)
  return {
      "accuracy": run.metric("test/accuracy"),
      "teacher_accuracy": run.metric("distill/teacher_accuracy"),
      "agreement": run.metric("distill/agreement"),
      "wall_s": run.wall_s,
      "images_per_s": run.images_per_s(skip=1),
  }


def _mean(runs, key):
  values = [r[key] for r in runs if r[key] is not None]
  return statistics.mean(values) if values else None


def main(argv):
  del argv
  results = {"distilled": [], "labels": []}
  with tempfile.TemporaryDirectory() as tmp:
    for seed in map(int, FLAGS.seeds):
      for name, preset in (("distilled", "digits"), ("labels",
                                                     "digits_labels")):
        run = _train(f"{tmp}/{name}-{seed}", preset, seed)
        run["seed"] = seed
        results[name].append(run)
        teacher = (f", teacher {run['teacher_accuracy']:.4f}, agreement "
                   f"{run['agreement']:.4f}" if run["teacher_accuracy"] else "")
        print(
            f"seed {seed} {name:9s} accuracy {run['accuracy']:.4f}{teacher}, "
            f"{run['images_per_s']:.0f} images/s, {run['wall_s']} s",
            flush=True)
  means = {
      name: {
          key: _mean(runs, key) for key in ("accuracy", "wall_s")
      } for name, runs in results.items()
  }
  lead = means["distilled"]["accuracy"] - means["labels"]["accuracy"]
  print(f"mean over {len(FLAGS.seeds)} seeds: distilled "
        f"{means['distilled']['accuracy']:.4f} "
        f"({means['distilled']['wall_s']:.0f} s), labels "
        f"{means['labels']['accuracy']:.4f} "
        f"({means['labels']['wall_s']:.0f} s), lead {lead:+.4f}")
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(
        json.dumps(dict(runs=results, means=means, lead=lead), indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
