r"""The train command: flags -> config -> `trainer.train_and_evaluate`
(`vit_jax/loop/trainer.py`).

    vit-jax train --config=configs/digits.py --workdir=workdirs/digits \
        --config.total_steps=500

(or `python -m vit_jax train ...`). On several hosts, run the same command
on every host with `--distributed` (TPU pods, SLURM and Open MPI are
detected by `jax.distributed.initialize`; elsewhere also pass
--coordinator_address, --num_processes and --process_id). The workdir may
be a `gs://` URL. See launch/ for ready-made launchers.
"""

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax.loop import trainer

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with an argument: FILE.py:ARG.",
    lock_config=True)
flags.DEFINE_string(
    "workdir", None, "Directory for metrics and checkpoints "
    "(local or gs://...).")
flags.DEFINE_integer(
    "preempted_exit_code", 0,
    "Exit status after a preemption notice (SIGTERM) stopped the run and its "
    "checkpoint was saved. Nonzero tells a scheduler the run is not done: "
    "launch/gke.py sets 143, so the JobSet restarts the slice and resumes.")
flags.mark_flags_as_required(["config", "workdir"])
cli.check_flag(
    "preempted_exit_code", lambda status: 0 <= status <= 255,
    "an exit status is 0 to 255; give 0 (done) or, for a scheduler that "
    "restarts the run, e.g. 143 (128 + SIGTERM).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cli.initialize_distributed()
  result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  if jax.process_index() == 0:
    print(" ".join(f"{k}={v:.6g}" for k, v in sorted(result.items())))
  if "preempted_at_step" in result:
    return FLAGS.preempted_exit_code
  return 0


if __name__ == "__main__":
  cli.run(main)
