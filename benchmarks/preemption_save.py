r"""How long a preemption save takes: the train state of a config, written by
the training loop's own checkpoint code, timed to the end of the write.

    .venv/bin/python benchmarks/preemption_save.py \
        --config=configs/pretrain.py:i1k,variant=ViT-L/16 --dir=/tmp/save_test
    .venv/bin/python benchmarks/preemption_save.py --config=... \
        --dir=gs://BUCKET/save_test --num_classes=21843 --repeats=3

A preempted run (SIGTERM) finishes its step, saves with `force=True` and
waits for the write to end before it exits, so this time plus one step is
what a launcher's grace period must cover (`launch/gke.py
--grace_seconds`). The state is made with the config's model, optimizer,
EMA and sharding rules on this host's devices; its values are the init's
(the write does not depend on them). Prints one JSON line: the state's
size, each save's seconds and its throughput.
"""

import json
import shutil
import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import objectives
from vit_jax import paths
from vit_jax import sharding
from vit_jax.training import checkpoint
from vit_jax.training import optim
from vit_jax.training import train_state

config_flags.DEFINE_config_file("config", None, "Config file[:ARG].",
                                lock_config=True)
flags.DEFINE_string("dir", "/tmp/vit_jax_preemption_save",
                    "Workdir to save into (local or gs://); emptied first.")
flags.DEFINE_integer("num_classes", 1000, "Classes of the head.")
flags.DEFINE_integer("repeats", 2, "Saves timed (each a new step).")
FLAGS = flags.FLAGS


def _empty(workdir: str):
  path = paths.resolve(workdir)
  if path.exists():
    if paths.is_remote(workdir):
      path.rmtree()
    else:
      shutil.rmtree(path)


def main(argv):
  del argv
  config = FLAGS.config
  mesh = sharding.mesh_from_config(config)
  decided = objectives.decide(config)
  model = objectives.of(decided).model(decided, FLAGS.num_classes)
  tx, _ = optim.make_optimizer(config, total_steps=1000)
  state, _ = train_state.create_train_state(model, tx, config.image_size,
                                            config.seed, mesh, config.sharding,
                                            ema=config.ema_decay > 0)
  size = sum(x.nbytes for x in jax.tree.leaves(state))
  _empty(FLAGS.dir)
  manager = checkpoint.make_manager(FLAGS.dir, config)
  seconds = []
  for step in range(1, FLAGS.repeats + 1):
    start = time.perf_counter()
    checkpoint.save(manager, step, state, force=True)
    manager.wait_until_finished()
    seconds.append(time.perf_counter() - start)
  manager.close()
  print(
      json.dumps({
          "variant": config.model.variant,
          "dir": FLAGS.dir,
          "devices": jax.device_count(),
          "state_gib": round(size / 2**30, 3),
          "save_seconds": [round(s, 2) for s in seconds],
          "gib_per_second": round(size / 2**30 / min(seconds), 2)
      }))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
