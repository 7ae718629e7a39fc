"""Command line: flags -> config -> `train.train_and_evaluate`.

    python -m vit_jax.main --config=configs/digits.py --workdir=workdirs/digits \
        --config.total_steps=500

On several hosts, run the same command on every host with `--distributed`
(TPU pods, SLURM and Open MPI are detected by `jax.distributed.initialize`;
elsewhere also pass --coordinator_address, --num_processes and --process_id).
See launch/ for ready-made launchers.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Keep TensorFlow quiet.

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from vit_jax import train  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with an argument: FILE.py:ARG.",
    lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for metrics and checkpoints.")
flags.DEFINE_bool("distributed", False,
                  "Join a multi-process run (jax.distributed.initialize).")
flags.DEFINE_string("coordinator_address", None,
                    "HOST:PORT of process 0; implies --distributed.")
flags.DEFINE_integer("num_processes", None, "Processes in the run.")
flags.DEFINE_integer("process_id", None, "This process's index.")
flags.mark_flags_as_required(["config", "workdir"])


def initialize_distributed():
  """Starts JAX's multi-process runtime when asked to (before any JAX use)."""
  if not (FLAGS.distributed or FLAGS.coordinator_address or
          os.environ.get("JAX_COORDINATOR_ADDRESS")):
    return
  jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                             num_processes=FLAGS.num_processes,
                             process_id=FLAGS.process_id)
  logging.info("Process %d of %d; %d local of %d devices.",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  initialize_distributed()
  if jax.process_index() > 0:  # One log for the run: process 0's.
    logging.set_verbosity(logging.WARNING)
  result = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  if jax.process_index() == 0:
    print(" ".join(f"{k}={v:.4f}" for k, v in sorted(result.items())))


if __name__ == "__main__":
  app.run(main)
