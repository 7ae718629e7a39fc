"""What several training processes compute, computed by one process.

The multi-process tests compare the checkpoint two `vit-jax train`
processes write together with one process training on the same devices
with the same global batches (process 0's share, then process 1's). For the
two to agree bit for bit, the reference must also sum its gradients with
the processes' collectives: XLA's in-process CPU all-reduce adds the
devices' terms in another order than gloo's, but gloo adds them in the same
order whether its ranks (the devices) live in one process or in two. So the
reference runs in a process of its own that joins a one-process
`jax.distributed` run with gloo collectives:

  python -m tests.helpers.gloo_reference SPEC OUT.npz

SPEC is a Python literal: {"data_dir", "overrides" (to configs/digits.py's
runlocal config), "devices", "num_steps", "also_before_last"}. OUT holds the
parameters after `num_steps` ("after/<path>") and, if asked, one step before
("before/<path>").
"""

import ast
import os
import socket
import subprocess
import sys
import tempfile

import numpy as np

from tests.helpers import processes

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compute(data_dir: str, overrides: dict, devices: int, num_steps: int,
            also_before_last: bool = False) -> dict[str, np.ndarray]:
  """Runs this module in a new process with `devices` CPU devices, the
  global batches made of 2 processes' shares; returns {"after/<path>":
  array, ...} after `num_steps` of the config's run (and "before/<path>",
  one step earlier)."""
  spec = dict(data_dir=str(data_dir), overrides=overrides, devices=devices,
              num_steps=num_steps, also_before_last=also_before_last)
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "reference.npz")
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.gloo_reference",
         repr(spec), out], cwd=REPO, env=processes.command_env(devices),
        capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(out) as saved:
      return dict(saved)


def params_of(saved: dict[str, np.ndarray], which: str) -> dict:
  """The flat {path: array} of "after" or "before"."""
  prefix = which + "/"
  return {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}


def flat_params(params) -> dict[str, np.ndarray]:
  """{path: numpy array} of a parameter tree, in this module's path form."""
  import jax  # pylint: disable=import-outside-toplevel
  leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
  return {jax.tree_util.keystr(path): np.asarray(x) for path, x in leaves}


def free_port() -> int:
  """A port nobody listens on now (taken again by the caller)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def apply_overrides(config, overrides: dict):
  """config[key] = value for each "section.field" (or "field") key."""
  for key, value in overrides.items():
    section, _, field = key.rpartition(".")
    (config[section] if section else config)[field] = value


def _reference(spec: dict) -> dict[str, np.ndarray]:
  # Imported here: the parent test process only needs `compute`.
  # pylint: disable=import-outside-toplevel
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"localhost:{free_port()}", num_processes=1,
                             process_id=0)
  from configs import digits
  from vit_jax import objectives
  from vit_jax import sharding
  from vit_jax.data import input_pipeline
  from vit_jax.loop import trainer
  from vit_jax.training import optim
  from vit_jax.training import train_state

  config = digits.get_config("runlocal")
  config.data_dir = spec["data_dir"]
  apply_overrides(config, spec["overrides"])
  config = objectives.decide(config)  # As `vit-jax train` decides it first.
  num_steps = spec["num_steps"]
  data = objectives.training_data(config)
  source = input_pipeline.make_source(data)
  shares = [
      input_pipeline.make_train_dataset(data, source, process_index=i,
                                        process_count=2).as_numpy_iterator()
      for i in range(2)
  ]
  mesh = sharding.mesh_from_config(config, jax.devices()[:spec["devices"]])
  # What `vit-jax train` builds: model, schedule (over the config's whole
  # run, its warm-up included) and step (FSDP's explicit gathers included).
  examples = input_pipeline.get_info(data, source).num_train_examples
  model = objectives.model(config, source.num_classes)
  tx, schedule = optim.make_optimizer(config,
                                      trainer.total_steps(config, examples),
                                      trainer.warmup_steps(config, examples))
  state, shardings = train_state.create_train_state(
      model, tx, config.image_size, config.seed, mesh, config.sharding)
  taught_by = objectives.of(config).teachers(config, mesh, source.num_classes)
  step = objectives.train_step(config, model, tx, schedule, mesh, shardings,
                               taught_by)
  saved = {}
  for i in range(num_steps):
    parts = [next(share) for share in shares]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if i == num_steps - 1 and spec["also_before_last"]:
      # A copy: the step donates the state it takes.
      saved.update({
          f"before/{k}": v for k, v in flat_params(state.params).items()
      })
    state, _ = step(state, sharding.to_global_batch(batch, mesh))
  saved.update({f"after/{k}": v for k, v in flat_params(state.params).items()})
  return saved


if __name__ == "__main__":
  np.savez(sys.argv[2], **_reference(ast.literal_eval(sys.argv[1])))
