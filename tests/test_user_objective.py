"""An objective is one file: this one. It registers `rotation` (each image
turned by 0, 90, 180 or 270 degrees, the model predicts which: Gidaris et
al. 2018), and the test trains it with the `train` command, naming this
file in config.imports and changing nothing in the package."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp

from tests.helpers import processes
from vit_jax import models
from vit_jax import objectives
from vit_jax.training import losses

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROTATIONS = 4
_DRAW = "rotation"  # The batch's entry: each image's quarter turns.


def rotated(images_BxHxWxC, quarter_turns_B):
  """Each (square) image turned by its number of quarter turns."""
  turned = [jnp.rot90(images_BxHxWxC, k, axes=(1, 2)) for k in range(4)]
  pick = quarter_turns_B[:, None, None, None]
  return sum(jnp.where(pick == k, turn, 0.0) for k, turn in enumerate(turned))


class Rotation(objectives.Objective):
  """Self-supervised: labels are not read."""
  name = "rotation"
  evaluators = ("loss", "fewshot")

  def model(self, config, num_classes):
    return models.build_model(config.model, ROTATIONS)

  def loss(self, config, mesh=None):

    def draw(batch, rng):  # Once per global batch: the same on any mesh.
      turns = jax.random.randint(rng, batch["image"].shape[:1], 0, ROTATIONS)
      return {_DRAW: turns}

    def sums(forward, batch, rng, teachers):
      del teachers
      turns = batch[_DRAW]
      logits, _ = forward(rotated(batch["image"], turns), rngs={"dropout": rng})
      targets = jax.nn.one_hot(turns, ROTATIONS)
      correct = (jnp.argmax(logits, -1) == turns).astype(jnp.float32)
      return objectives.weighted_sums(losses.softmax_xent(logits, targets),
                                      batch.get("mask"), accuracy=correct)

    return objectives.Loss(sums, draw=draw)

  def describe(self, config, num_classes, teachers=()):
    return f"{ROTATIONS} rotations"


objectives.register(Rotation())

CONFIG = """
from vit_jax.config import defaults


def get_config(arg=None):
  config = defaults.get_config()
  defaults.runlocal(config)
  config.imports = ({module!r},)
  config.objective = "rotation"
  config.data_dir = {data_dir!r}
  config.model.variant = "digits"
  config.total_steps = 60
  config.lr = 3e-3
  config.log_every_steps = 20
  return config.lock()
"""


def test_an_objective_of_ones_own_trains_with_the_train_command(
    tmp_path, tfds_data_dir):
  config_file = tmp_path / "rotation_config.py"
  config_file.write_text(
      CONFIG.format(module=os.path.abspath(__file__), data_dir=tfds_data_dir))
  workdir = tmp_path / "run"
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "train", f"--config={config_file}",
      f"--workdir={workdir}"
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  said = done.stdout + done.stderr
  assert "(4 rotations)" in said
  # Its own evaluation ran at the end (the objective lists `loss`), the
  # labels' did not (`classification` is not among its evaluators); it
  # learnt: chance is ln 4 = 1.386 and 25%.
  assert "test: accuracy" not in said
  found = re.search(
      r"Step 60: loss accuracy ([0-9.]+), loss ([0-9.]+) on 360 examples", said)
  assert found, said[-3000:]
  accuracy, loss = map(float, found.groups())
  assert loss < 1.2 and accuracy > 0.4, (loss, accuracy)
  assert json.loads(
      (workdir / "config.json").read_text())["objective"] == ("rotation")
