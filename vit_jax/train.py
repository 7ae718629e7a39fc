r"""The train command: flags -> config -> `trainer.train_and_evaluate`.

    vit-jax train --config=configs/digits.py --workdir=workdirs/digits \
        --config.total_steps=500

(or `python -m vit_jax.train ...`). On several hosts, run the same command
on every host with `--distributed` (TPU pods, SLURM and Open MPI are
detected by `jax.distributed.initialize`; elsewhere also pass
--coordinator_address, --num_processes and --process_id). The workdir may
be a `gs://` URL. See launch/ for ready-made launchers.
"""

from vit_jax import cli  # First: the commands' preamble.

cli.import_tensorflow_quietly()

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from vit_jax import trainer  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with an argument: FILE.py:ARG.",
    lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for metrics and checkpoints "
                    "(local or gs://...).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cli.initialize_distributed()
  result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  if jax.process_index() == 0:
    print(" ".join(f"{k}={v:.6g}" for k, v in sorted(result.items())))


if __name__ == "__main__":
  cli.run(main)
