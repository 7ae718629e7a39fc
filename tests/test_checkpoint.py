"""Checkpoints: a killed run resumes on the same trajectory; any device
count."""

import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.helpers import processes
from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.training import checkpoint
from vit_jax.training import optim
from vit_jax.training import train_state

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOTAL_STEPS = 100


def _command(workdir, data_dir):
  return [
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
      f"--config.data_dir={data_dir}", "--config.model.variant=digits",
      f"--config.total_steps={TOTAL_STEPS}",
      "--config.checkpoint_every_steps=25", "--config.eval_every_steps=0",
      "--config.log_every_steps=1000", "--config.ema_decay=0.99",
      "--config.model.dropout_rate=0.1", "--config.label_smoothing=0.1"
  ]


def _run(workdir, data_dir, kill_after_checkpoint=None, sig=None):
  """Runs main; optionally sends `sig` once that checkpoint is written."""
  env = processes.command_env()
  proc = subprocess.Popen(_command(
      workdir, data_dir), cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  if kill_after_checkpoint is not None:
    marker = os.path.join(workdir, "checkpoints", str(kill_after_checkpoint))
    deadline = time.time() + 240
    while not os.path.exists(marker) and proc.poll() is None:
      assert time.time() < deadline, "no checkpoint appeared"
      time.sleep(0.02)
    proc.send_signal(sig)
  stdout, stderr = proc.communicate(timeout=300)
  return proc.returncode, stdout, stderr


def _final_params(workdir):
  """Parameters and their average (dropout and EMA are on in these runs)."""
  path = os.path.join(workdir, "checkpoints", str(TOTAL_STEPS), "default")
  saved = ocp.StandardCheckpointer().restore(path)
  return saved["params"], saved["ema_params"]


def test_killed_run_resumes_the_same_trajectory(tfds_data_dir, tmp_path):
  """A preemption notice (SIGTERM: a checkpoint at the step reached, exit 0)
  and then a hard kill (SIGKILL: the last periodic checkpoint survives);
  each rerun resumes, and the end equals an uninterrupted run's."""
  code, reference, err = _run(str(tmp_path / "whole"), tfds_data_dir)
  assert code == 0, err[-3000:]

  interrupted = str(tmp_path / "interrupted")
  saved = lambda: [
      int(d)
      for d in os.listdir(os.path.join(interrupted, "checkpoints"))
      if d.isdigit()
  ]
  code, out, err = _run(interrupted, tfds_data_dir, kill_after_checkpoint=25,
                        sig=signal.SIGTERM)
  assert code == 0 and "preempted_at_step=" in out, err[-3000:]
  assert 25 <= max(saved()) < 75

  code, out, err = _run(interrupted, tfds_data_dir, kill_after_checkpoint=75,
                        sig=signal.SIGKILL)
  assert code == -signal.SIGKILL
  assert "Resuming at step" in err
  assert 75 <= max(saved()) < TOTAL_STEPS

  code, resumed, err = _run(interrupted, tfds_data_dir)
  assert code == 0, err[-3000:]
  assert "Resuming at step" in err
  # The final train loss and parameters equal the uninterrupted run's.
  final = lambda text: text.strip().splitlines()[-1]
  assert final(resumed) == final(reference)
  jax.tree.map(np.testing.assert_array_equal, _final_params(interrupted),
               _final_params(str(tmp_path / "whole")))


def _state(config, mesh, variant="testing"):
  config.model.variant = variant
  model = models.build_model(weights.decide(config).model, 10)
  tx, _ = optim.make_optimizer(config, 10)
  return train_state.create_train_state(model, tx, config.image_size,
                                        config.seed, mesh)


@pytest.mark.parametrize("save_on, load_on", [(8, 1), (1, 8)])
def test_checkpoint_restores_on_another_device_count(digits_config, tmp_path,
                                                     save_on, load_on):
  mesh = lambda n: sharding.make_mesh(devices=jax.devices()[:n])
  state, _ = _state(digits_config, mesh(save_on))
  state = state.replace(step=state.step + 7)
  manager = checkpoint.make_manager(str(tmp_path), digits_config)
  checkpoint.save(manager, 7, state)
  manager.wait_until_finished()

  digits_config.seed += 1  # A different init, to be overwritten.
  fresh, fresh_sharding = _state(digits_config, mesh(load_on))
  restored = checkpoint.restore_latest(manager, fresh, fresh_sharding)
  assert int(restored.step) == 7
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params),
               jax.device_get(state.params))
  leaf = jax.tree.leaves(restored.params)[0]
  assert len(leaf.sharding.device_set) == load_on


def test_checkpoint_of_another_model_is_refused(digits_config, tmp_path):
  state, _ = _state(digits_config, sharding.make_mesh())
  manager = checkpoint.make_manager(str(tmp_path), digits_config)
  checkpoint.save(manager, 1, state)
  manager.wait_until_finished()
  other, other_sharding = _state(digits_config, sharding.make_mesh(), "digits")
  with pytest.raises(ValueError, match="does not match this config's model"):
    checkpoint.restore_latest(manager, other, other_sharding)


def _damage(step_dir, how: str):
  """Truncates or garbles every array data file of a saved step."""
  files = [
      p for p in (step_dir / "default").rglob("*")
      if p.is_file() and p.parent.name == "d"
  ]
  assert files
  for path in files:
    data = bytearray(path.read_bytes())
    if how == "truncated":
      data = data[:len(data) // 2]
    else:
      for i in range(len(data) // 4, len(data), 61):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _train(workdir, data_dir, total_steps):
  """`vit-jax train` in its own process (a resume reads the files anew)."""
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
      f"--config.data_dir={data_dir}", f"--config.total_steps={total_steps}",
      "--config.checkpoint_every_steps=2", "--config.keep_checkpoints=4",
      "--config.eval_every_steps=0"
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  return done


@pytest.fixture(scope="module")
def whole_run(tfds_data_dir, tmp_path_factory):
  """A run of 8 steps with its checkpoints at 2, 4, 6 and 8."""
  workdir = tmp_path_factory.mktemp("runs") / "whole"
  done = _train(workdir, tfds_data_dir, 8)
  assert done.returncode == 0, done.stderr[-3000:]
  return workdir


def _stopped_at_6(whole, folder):
  """A copy of the whole run as it was at step 6 (its step 8 not taken)."""
  run = folder / "run"
  shutil.copytree(whole, run)
  shutil.rmtree(run / "checkpoints" / "8")
  return run


@pytest.mark.xdist_group("runs_to_resume")  # The whole run made once.
def test_damaged_newest_checkpoints_resume_from_the_newest_intact_one(
    whole_run, tfds_data_dir, tmp_path):
  """The newest step truncated and the one before garbled: both are set
  aside, and the run resumes from the step before them and ends where the
  whole run does."""
  run = _stopped_at_6(whole_run, tmp_path)
  _damage(run / "checkpoints" / "6", "truncated")
  _damage(run / "checkpoints" / "4", "garbled")
  done = _train(run, tfds_data_dir, 8)
  assert done.returncode == 0, done.stderr[-3000:]
  said = done.stderr
  for step in (6, 4):
    assert f"The checkpoint at step {step} cannot be restored (" in said
    assert (f"it is set aside as {step}.damaged, and the run resumes from "
            "step 2, the newest intact one.") in said
  assert "Resuming at step 2 from" in said
  assert "Traceback" not in said  # TensorStore's late callbacks are quiet.
  assert sorted(os.listdir(
      run / "checkpoints")) == ["2", "4", "4.damaged", "6", "6.damaged", "8"]
  restore = lambda wd: ocp.StandardCheckpointer().restore(
      wd / "checkpoints" / "8" / "default")["params"]
  jax.tree.map(np.testing.assert_array_equal, restore(run), restore(whole_run))


@pytest.mark.xdist_group("runs_to_resume")
def test_no_intact_checkpoint_is_a_one_line_error(whole_run, tfds_data_dir,
                                                  tmp_path):
  run = _stopped_at_6(whole_run, tmp_path)
  for step in (2, 4, 6):
    _damage(run / "checkpoints" / str(step), "truncated")
  done = _train(run, tfds_data_dir, 8)
  assert done.returncode == 2, done.stderr[-3000:]
  error = [line for line in done.stderr.splitlines() if "error:" in line]
  assert len(error) == 1 and error[0].startswith(
      f"error: No checkpoint in {run}/checkpoints can be restored: step 6: ")
  assert "; step 4: " in error[0] and "; step 2: " in error[0]
  assert "Traceback" not in done.stderr
  assert error[0].endswith(
      ". Move the folder aside (or use a new --workdir) to start afresh.")
