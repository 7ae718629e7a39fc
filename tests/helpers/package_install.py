"""The package installed as `pip install SOURCE` does (not editable) into a
new virtual environment, without a download: a .pth file appends this
environment's site-packages to the new one's path for the dependencies
(the .pth files in there, such as the editable install's, are not
processed, so the repository itself is not on the path)."""

import os
import subprocess
import sys
import sysconfig

from tests.helpers import processes


def install(source, venv) -> str:
  """Installs the package in folder `source` into a new venv at `venv`;
  returns the venv's bin folder."""
  subprocess.run([sys.executable, "-m", "venv", "--without-pip",
                  str(venv)], check=True)
  python = os.path.join(venv, "bin", "python")
  site = subprocess.run([
      python, "-c", "import sysconfig; print(sysconfig.get_paths()"
      "['purelib'])"
  ], check=True, capture_output=True, text=True).stdout
  with open(os.path.join(site.strip(), "dependencies.pth"), "w") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")
  done = subprocess.run([
      sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
      "--no-deps", "--no-build-isolation", "--no-index",
      str(source)
  ], capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return os.path.join(venv, "bin")


def clean_env() -> dict[str, str]:
  """This process's environment less what the tests set for themselves (but
  the suite's compiler flags)."""
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ("PYTHONPATH", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL")
  }
  return {**env, "XLA_FLAGS": processes.COMPILER_FLAGS}
