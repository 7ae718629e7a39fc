"""The fewshot command: few-shot sweeps (see `vit_jax/fewshot/sweep.py`).

    vit-jax fewshot --config=configs/fewshot.py:digits \
        --checkpoints=workdirs/demo/pretrain --workdir=workdirs/fewshot

(or `python -m vit_jax fewshot ...`). With `--distributed` (as for
training) every host extracts its share of the features; process 0 prints
and writes the results.
"""

from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax.fewshot import sweep

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_list("checkpoints", None, "Weights files or workdirs.")
flags.DEFINE_list("datasets", None,
                  "Datasets (default: config.fewshot.datasets).")
flags.DEFINE_string("workdir", None,
                    "Where the JSON and CSV go (local or gs://...).")
flags.mark_flags_as_required(["config", "checkpoints"])


def main(argv):
  del argv
  cli.initialize_distributed()
  table, notes = sweep.sweep(FLAGS.config, FLAGS.checkpoints, FLAGS.datasets)
  if jax.process_index() == 0:
    if FLAGS.workdir:
      sweep.write(table, FLAGS.workdir)
    print(sweep.describe_protocol(FLAGS.config.fewshot))
    print(sweep.format_table(table, FLAGS.config.fewshot.shots))
    for note in notes:
      print(f"note: {note}")


if __name__ == "__main__":
  cli.run(main)
