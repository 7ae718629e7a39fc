"""The package as a user installs it: `pip install .` (not editable) into a
fresh virtual environment, commands run from another directory with configs
given by path, and a console a person can read. (The new environment gets
its dependencies from this one: `tests/helpers/package_install.py`.)
"""

import os
import pathlib
import shutil
import subprocess

import pytest

from tests.helpers import package_install

# One worker builds the installed environment, once.
pytestmark = pytest.mark.xdist_group("install")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_RUNLOCAL_LINES = 30


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(the new environment's bin folder, an empty folder outside the repo)."""
  root = tmp_path_factory.mktemp("install")
  source = root / "source"  # A copy: the build writes into its source tree.
  # Not the virtual environments (.venv, .venv-torch: gigabytes each).
  shutil.copytree(
      REPO, source,
      ignore=shutil.ignore_patterns(".git", ".venv*", "workdirs", "build",
                                    "*.egg-info", "__pycache__", ".*_cache"))
  bin_dir = package_install.install(source, root / "venv")
  elsewhere = root / "elsewhere"
  elsewhere.mkdir()
  return pathlib.Path(bin_dir), elsewhere


def _run(command, cwd, timeout=600):
  return subprocess.run(command, cwd=cwd, env=package_install.clean_env(),
                        capture_output=True, text=True, timeout=timeout)


def test_the_installed_package_is_not_the_repository(installed):
  bin_dir, elsewhere = installed
  done = _run([
      str(bin_dir / "python"), "-c", "import vit_jax; print(vit_jax.__file__)"
  ], elsewhere)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.startswith(str(bin_dir.parent)), done.stdout
  listing = _run([str(bin_dir / "vit-jax")], elsewhere)
  assert listing.returncode == 2
  for name in ("train", "fewshot", "inspect", "export", "plan", "benchmark"):
    assert f"\n  {name} " in listing.stderr, listing.stderr


def test_runlocal_from_another_directory_prints_a_short_console(
    installed, tfds_data_dir, tmp_path):
  """The repository's config by path, from outside the repository: one
  line per log step, evaluation and checkpoint; no third-party INFO."""
  bin_dir, elsewhere = installed
  done = _run([
      str(bin_dir / "vit-jax"), "train",
      f"--config={REPO}/configs/digits.py:runlocal",
      f"--workdir={tmp_path / 'run'}", f"--config.data_dir={tfds_data_dir}"
  ], elsewhere)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = (done.stdout + done.stderr).splitlines()
  assert len(lines) <= MAX_RUNLOCAL_LINES, "\n".join(lines)
  console = "\n".join(lines)
  assert "Step 5/10: loss" in console and "Step 10/10: loss" in console
  assert "Step 10: saving a checkpoint" in console
  assert "Step 10: test accuracy" in console
  assert "test/accuracy=" in done.stdout
  assert "orbax" not in console.lower() and "I0000" not in console

  again = _run([
      str(bin_dir / "vit-jax"), "train",
      f"--config={REPO}/configs/digits.py:runlocal",
      f"--workdir={tmp_path / 'run'}", f"--config.data_dir={tfds_data_dir}"
  ], elsewhere)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Resuming at step 10 from {tmp_path / 'run'}" in again.stderr


def test_a_users_own_config_file_and_python_m(installed, tfds_data_dir,
                                              tmp_path):
  """A config anywhere on disk starts from the installed defaults; the
  `python -m vit_jax NAME` form works as well as `vit-jax NAME`."""
  bin_dir, elsewhere = installed
  config_file = tmp_path / "my_config.py"
  config_file.write_text("from vit_jax.config import defaults\n\n\n"
                         "def get_config(arg=None):\n"
                         "  config = defaults.get_config()\n"
                         "  defaults.runlocal(config)\n"
                         "  config.total_steps = 2\n"
                         "  return config.lock()\n")
  done = _run([
      str(bin_dir / "python"), "-m", "vit_jax", "train",
      f"--config={config_file}", f"--workdir={tmp_path / 'run'}",
      f"--config.data_dir={tfds_data_dir}"
  ], elsewhere)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Step 2/2: loss" in done.stderr
  assert (tmp_path / "run" / "checkpoints" / "2").is_dir()


def test_a_users_op_evaluator_variant_and_dataset_from_outside(
    installed, tfds_data_dir, tmp_path):
  """tests/fixtures/user_project, copied outside the repository: its config
  names its own module in config.imports, which registers a preprocessing
  op, an evaluator type and a model variant; the config adds an entry of
  that type and one more evaluation dataset. The installed package runs
  them all, without a change to it."""
  bin_dir, elsewhere = installed
  project = shutil.copytree(
      os.path.join(REPO, "tests", "fixtures", "user_project"),
      tmp_path / "project")
  done = _run([
      str(bin_dir / "vit-jax"), "train", f"--config={project / 'my_config.py'}",
      f"--workdir={tmp_path / 'run'}", f"--config.data_dir={tfds_data_dir}"
  ], elsewhere)
  assert done.returncode == 0, done.stderr[-3000:]
  metrics = dict(item.split("=") for item in done.stdout.split())
  assert float(metrics["stats/images"]) == 200.0  # 100 images, scale 2.
  assert "stats/head_bias_mean" in metrics
  assert float(metrics["holdout/num_examples"]) == 144  # 10% of 1,437.
  assert "test/accuracy" in metrics
  assert "Step 2: stats 200 images" in done.stderr
