"""The container image, checked without a container engine (none runs on
the machines the tests run on): hadolint finds nothing in the Dockerfile;
the build context that .dockerignore leaves, by docker-py's own matcher,
holds what the Dockerfile copies and nothing else; the final stage has no
build step, runs as a numeric non-root user and has `vit-jax` as its entry
point; and the image's files, laid out in a folder by the Dockerfile's own
COPY and install steps, run that entry point from its working directory.
"""

import os
import pathlib
import posixpath
import shutil
import subprocess
import sysconfig

import docker.utils.build
from dockerfile_parse import DockerfileParser

from tests.helpers import package_install

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO, "Dockerfile")


def _stages() -> list[list[dict]]:
  """The Dockerfile's instructions, one list per FROM."""
  stages = []
  for instruction in DockerfileParser(DOCKERFILE).structure:
    if instruction["instruction"] == "FROM":
      stages.append([])
    if stages and instruction["instruction"] != "COMMENT":
      stages[-1].append(instruction)
  return stages


def _values(stage, name) -> list[str]:
  return [i["value"] for i in stage if i["instruction"] == name]


def _context() -> set[str]:
  """Paths (files and folders) `docker build .` would send."""
  with open(os.path.join(REPO, ".dockerignore")) as f:
    patterns = [
        line.strip() for line in f if line.strip() and not line.startswith("#")
    ]
  return set(docker.utils.build.exclude_paths(REPO, patterns))


def _context_copies(stage) -> list[tuple[list[str], str]]:
  """(sources, absolute destination) of each COPY from the context."""
  workdir, copies = "/", []
  for instruction in stage:
    value = instruction["value"]
    if instruction["instruction"] == "WORKDIR":
      workdir = posixpath.join(workdir, value)
    elif instruction["instruction"] == "COPY" and not value.startswith("--"):
      *sources, destination = value.split()
      absolute = posixpath.join(workdir, destination)
      copies.append(
          (sources, absolute + ("/" if destination.endswith("/") else "")))
  return copies


def _lay_out(stage, context, root: pathlib.Path):
  """Does the stage's COPYs from the context into `root` (as /)."""
  for sources, destination in _context_copies(stage):
    target = root / destination.lstrip("/")
    for source in sources:
      members = sorted(
          p for p in context if p == source or p.startswith(source + "/"))
      assert members, f"COPY {source}: not in the build context"
      for path in members:
        if os.path.isdir(os.path.join(REPO, path)):
          continue
        if path == source:  # A file: into a folder, or as the named file.
          out = target / path if destination.endswith("/") else target
        else:  # A folder's contents go into the destination.
          out = target / path[len(source) + 1:]
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(REPO, path), out)


def test_hadolint_finds_nothing():
  hadolint = os.path.join(sysconfig.get_path("scripts"), "hadolint")
  done = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True,
                        timeout=60)
  assert (done.returncode, done.stdout) == (0, ""), done.stdout


def test_the_build_context_is_what_the_image_copies():
  context = _context()
  copied = {
      source for stage in _stages() for sources, _ in _context_copies(stage)
      for source in sources
  }
  assert copied == {"setup.py", "constraints.txt", "vit_jax", "configs"}
  always_sent = {"Dockerfile", ".dockerignore"}
  for path in context - always_sent:
    assert path.split("/")[0] in copied, path
    assert "__pycache__" not in path and not path.endswith(".pyc"), path
  tracked = subprocess.run(["git", "ls-files", "vit_jax", "configs"], cwd=REPO,
                           capture_output=True, text=True,
                           check=True).stdout.split()
  assert set(tracked) <= context


def test_the_final_stage_installs_nothing_and_runs_vit_jax_unprivileged():
  build, final = _stages()
  assert _values(build, "FROM")[0].endswith(" AS build")
  assert _values(build, "ARG") == ["EXTRA=tpu"]
  [install] = _values(build, "RUN")
  assert "pip install --no-cache-dir -c constraints.txt \".[${EXTRA}]\"" \
      in install
  assert "test" not in install
  assert _values(final, "FROM") == [_values(build, "FROM")[0].split()[0]]
  assert _values(
      final, "RUN") == ["useradd --create-home --uid 1000 --user-group vit"]
  assert "--from=build /opt/venv /opt/venv" in _values(final, "COPY")
  [user] = _values(final, "USER")
  assert user.split(":")[0].isdigit() and int(user.split(":")[0]) > 0
  assert _values(final, "ENTRYPOINT") == ['["vit-jax"]']
  with open(DOCKERFILE) as f:  # Both stages' base: the tests' Python.
    assert "\nARG PYTHON_IMAGE=python:3.13-slim" in f.read()


def test_the_images_files_run_its_entry_point(tmp_path, tfds_data_dir):
  """Both stages' COPYs from the build context into a folder standing for
  the image's root, the build stage's install into its /opt/venv, then
  `vit-jax train` from the final stage's working directory."""
  build, final = _stages()
  context, root = _context(), tmp_path / "image"
  _lay_out(build, context, root)
  bin_dir = package_install.install(root / "src", root / "opt" / "venv")
  _lay_out(final, context, root)
  workdir = _values(final, "WORKDIR")[-1]
  done = subprocess.run([
      os.path.join(bin_dir, "vit-jax"), "train",
      "--config=configs/digits.py:runlocal", f"--workdir={tmp_path / 'run'}",
      f"--config.data_dir={tfds_data_dir}", "--config.total_steps=2"
  ], cwd=root / workdir.lstrip("/"), env=package_install.clean_env(),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Step 2/2: loss" in done.stderr
  assert (tmp_path / "run" / "checkpoints" / "2").is_dir()
