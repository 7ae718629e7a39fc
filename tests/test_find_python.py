"""Which Python `make` and launch/setup_host.sh build on
(launch/find_python.sh), against stand-in Pythons that only say their
version: python3 when it is 3.12+, else the newest 3.13 / 3.12 that runs,
on PATH or under pyenv; else one line naming what to install."""

import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIND = os.path.join(REPO, "launch", "find_python.sh")


def _python(path, version=None):
  """A stand-in that answers --version, or fails as an inactive pyenv shim
  does (version None)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    if version:
      f.write(f'#!/bin/sh\necho "Python {version}"\n')
    else:
      f.write('#!/bin/sh\necho "pyenv: $(basename $0): command not found" >&2'
              '\nexit 127\n')
  os.chmod(path, 0o755)
  return str(path)


def _find(tmp_path, cwd=None, command=(FIND,)):
  env = {
      "PATH": f"{tmp_path}/bin:/usr/bin:/bin",
      "HOME": str(tmp_path / "home"),
      "PYENV_ROOT": str(tmp_path / "pyenv")
  }
  return subprocess.run(list(command), env=env, cwd=cwd, capture_output=True,
                        text=True, timeout=60)


def test_python3_when_it_is_new_enough(tmp_path):
  python3 = _python(tmp_path / "bin" / "python3", "3.12.3")
  _python(tmp_path / "bin" / "python3.13", "3.13.1")
  done = _find(tmp_path)
  assert done.returncode == 0 and done.stdout.strip() == python3


def test_the_newest_that_runs_on_path_then_under_pyenv(tmp_path):
  _python(tmp_path / "bin" / "python3", "3.11.7")
  _python(tmp_path / "bin" / "python3.13")  # A shim that does not run.
  on_path = _python(tmp_path / "bin" / "python3.12", "3.12.1")
  assert _find(tmp_path).stdout.strip() == on_path
  os.remove(on_path)
  _python(tmp_path / "pyenv/versions/3.12.1/bin/python3.12", "3.12.1")
  _python(tmp_path / "pyenv/versions/3.13.2/bin/python3.13", "3.13.2")
  newest = _python(tmp_path / "pyenv/versions/3.13.10/bin/python3.13",
                   "3.13.10")
  done = _find(tmp_path)
  assert done.returncode == 0 and done.stdout.strip() == newest


def test_none_found_is_one_line_naming_what_to_install(tmp_path):
  _python(tmp_path / "bin" / "python3", "3.10.12")
  done = _find(tmp_path)
  assert done.returncode == 1 and not done.stdout
  assert done.stderr.splitlines() == [
      "error: vit_jax needs Python 3.12 or newer and found none here "
      "(python3 is Python 3.10.12); install python3.13 or python3.12 (e.g. "
      "'uv python install 3.13', 'pyenv install 3.13', or 'apt-get install "
      "python3.12-venv'), or name one with PYTHON=/path/to/python3."
  ]


def test_make_stops_with_that_line_before_touching_a_venv(tmp_path):
  """`make setup` where no Python 3.12+ is found (a copy of the Makefile,
  so the repository's .venv is never at stake)."""
  project = tmp_path / "project"
  (project / "launch").mkdir(parents=True)
  for name in ("Makefile", "setup.py", "constraints.txt",
               "launch/find_python.sh"):
    shutil.copy2(os.path.join(REPO, name), project / name)
  _python(tmp_path / "bin" / "python3", "3.11.2")
  done = _find(tmp_path, cwd=project, command=("make", "setup"))
  assert done.returncode == 2, done.stdout + done.stderr
  assert ("error: vit_jax needs Python 3.12 or newer and found none here "
          "(python3 is Python 3.11.2)") in done.stderr
  assert not (project / ".venv").exists()
