"""Two processes on localhost (JAX's CPU collectives) train as one.

The README's multi-host command runs twice, with 4 fake CPU devices per
process; the checkpoint they write together equals one process training on
8 devices with the same global batches (process 0's share, then process 1's).
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import models, optim, sharding, steps
from vit_jax.data import input_pipeline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4
OVERRIDES = {"total_steps": STEPS, "checkpoint_every_steps": STEPS,
             "eval_every_steps": 0, "optimizer": "sgd", "lr": 0.1,
             "sharding.params": ((".*", "fsdp"),),
             "sharding.fsdp_min_size": 0}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch_two_processes(workdir, data_dir):
  port = _free_port()
  env = {**os.environ,
         "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
  procs = []
  for process_id in range(2):
    cmd = [sys.executable, "-m", "vit_jax.main",
           "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
           f"--config.data_dir={data_dir}",
           f"--coordinator_address=localhost:{port}", "--num_processes=2",
           f"--process_id={process_id}"]
    cmd += [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, text=True,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE))
  try:
    outputs = [proc.communicate(timeout=400) for proc in procs]
  except BaseException:  # A hung or failed launch must not outlive the test.
    for proc in procs:
      proc.kill()
    raise
  return [p.returncode for p in procs], outputs


def _one_process_reference(config):
  """8 devices, one process, global batches = concat of the two shares."""
  source = input_pipeline.make_source(config)
  shares = [input_pipeline.make_train_dataset(
      config, source, process_index=i, process_count=2).as_numpy_iterator()
            for i in range(2)]
  mesh = sharding.mesh_from_config(config)
  model = models.build_model(config.model, source.num_classes)
  tx, schedule = optim.make_optimizer(config, STEPS)
  state, shardings = steps.create_train_state(
      model, tx, config.image_size, config.seed, mesh, config.sharding)
  step = steps.jit_train_step(steps.make_train_step(
      model, tx, steps.softmax_xent, schedule, mesh), shardings, mesh,
                              config.sharding.logical_axis_rules)
  for _ in range(STEPS):
    parts = [next(share) for share in shares]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    state, _ = step(state, sharding.to_global_batch(batch, mesh))
  return state


def test_two_processes_equal_one_with_the_same_global_batch(
    digits_config, tfds_data_dir, tmp_path):
  workdir = str(tmp_path / "two")
  codes, outputs = _launch_two_processes(workdir, tfds_data_dir)
  assert codes == [0, 0], "\n".join(err[-3000:] for _, err in outputs)
  # Only process 0 reports.
  assert "test_accuracy=" in outputs[0][0]
  assert "test_accuracy=" not in outputs[1][0]

  for key, value in OVERRIDES.items():
    section, _, field = key.rpartition(".")
    (digits_config[section] if section else digits_config)[field] = value
  expected = _one_process_reference(digits_config)
  # Restored onto this process's 8-device mesh, not the writers' topology.
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      expected)
  saved = ocp.StandardCheckpointer().restore(
      os.path.join(workdir, "checkpoints", str(STEPS), "default"), target)
  assert int(saved.step) == STEPS
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                       atol=1e-6),
               jax.device_get(saved.params), jax.device_get(expected.params))
