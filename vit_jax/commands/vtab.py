r"""The vtab command: fine-tune one checkpoint on the VTAB-1k tasks
(`vit_jax/vtab/runner.py`).

    vit-jax vtab --config=configs/vtab.py --checkpoint=PATH \
        --workdir=workdirs/vtab [--tasks=dtd,clevr_count]

(or `python -m vit_jax vtab ...`). `--config=configs/vtab.py:split=val`
trains on train800 and evaluates on val200 instead of the reported
train800val200 -> test. Runs the tasks one after the other, each in
WORKDIR/TASK (see `vit_jax/vtab/runner.py`: a finished task is not rerun,
an interrupted one resumes), then prints each task's accuracy, the group
means and the VTAB score, and writes them to WORKDIR/vtab.json. With
`--distributed` every host runs each task together, as for training.
"""

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax import console
from vit_jax.errors import UserError
from vit_jax.vtab import runner

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "The transfer setting: configs/vtab.py[:split=val,...]; "
    "its task is replaced by each task.", lock_config=True)
flags.DEFINE_string(
    "checkpoint", None, "Pre-trained weights to fine-tune "
    "(any format config.init.checkpoint reads); default: "
    "config.init.checkpoint.")
flags.DEFINE_string(
    "workdir", None, "Where each task's run and vtab.json go "
    "(local or gs://...).")
flags.DEFINE_list("tasks", None, "VTAB tasks to run (default: all 19).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = FLAGS.config
  if FLAGS.checkpoint:
    config = config.copy_and_resolve_references()
    config.init.checkpoint = FLAGS.checkpoint
  if not config.init.checkpoint:
    raise UserError("VTAB fine-tunes pre-trained weights: pass "
                    "--checkpoint=PATH (or init=PATH in the config argument).")
  cli.initialize_distributed()
  accuracy = runner.run_tasks(config, FLAGS.workdir, FLAGS.tasks)
  if jax.process_index() == 0 and accuracy:
    summary = runner.summarize(accuracy)
    print(runner.format_table(summary))
    path = runner.write(summary, config, FLAGS.workdir)
    console.say("Wrote the results to %s.", path)


if __name__ == "__main__":
  cli.run(main)
