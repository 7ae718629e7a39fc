"""benchmarks/gpu_check.sh in its dry mode on CPU: every line of the GPU
check runs (our benchmark, timm's on the same model, the table) with the
tiny `testing` model, so a lent GPU's minutes go to measuring."""

import json
import os
import re
import subprocess
import sys
import zipfile

from tests.helpers import processes
from tests.helpers import torch_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Python 3.11 with torch's CPU build and timm (tests/references/torch_env.sh).
TORCH_PYTHON = torch_env.TORCH_PYTHON
WHEEL = os.path.join(REPO, "benchmarks", "wheels",
                     "ml_collections-1.1.0-py3-none-any.whl")


def test_dry_run_prints_ours_and_timms_rows_for_the_same_model(tmp_path):
  torch_env.require()
  env = {
      **processes.command_env(), "PYTHON": sys.executable,
      "TORCH_PYTHON": TORCH_PYTHON,
      "OUT": str(tmp_path)
  }
  # torch's own deprecations are not ours to fix (ours are errors in
  # tests/test_benchmark.py, which runs the same benchmark).
  env.pop("PYTHONWARNINGS", None)
  done = subprocess.run(
      [os.path.join(REPO, "benchmarks", "gpu_check.sh"), "--dry"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert re.fullmatch(
      r"gpu_check: device cpu, jax [\d.]+, timm [\d.]+, torch [\w.+]+",
      lines[0]), lines
  assert lines[1].split() == [
      "model", "batch", "code", "images/s", "MFU", "peak", "GiB", "compile",
      "s", "loss"
  ]
  for line, code in zip(lines[2:5], ("ours", "timm", "ours-fp8")):
    cells = line.split()
    assert cells[:3] == ["testing", "8", code], lines
    assert float(cells[3].replace(",", "")) > 0 and cells[4:6] == ["-", "-"]
  assert lines[5] == f"(results and logs: {tmp_path})"
  ours = json.loads((tmp_path / "testing.ours.json").read_text())
  timm = json.loads((tmp_path / "testing.timm.json").read_text())
  fp8 = json.loads((tmp_path / "testing.ours-fp8.json").read_text())
  assert fp8["fp8"] is True and ours["fp8"] is False
  assert fp8["parameters"] == ours["parameters"]
  # The same model (parameter for parameter), batch and images.
  assert ours["parameters"] == timm["parameters"] == 23_320
  for key in ("batch", "image_size", "dtype"):
    assert ours[key] == timm[key], key
  assert ours["dtype"] == "bfloat16" and 0 < timm["final_loss"] < 20


def test_the_carried_ml_collections_wheel_imports_from_the_zip():
  """The GPU machines lack ml_collections; the script puts this wheel on
  PYTHONPATH, from which Python imports it without installing."""
  with zipfile.ZipFile(WHEEL) as wheel:
    assert "ml_collections/__init__.py" in wheel.namelist()
  done = subprocess.run([
      sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
      "import ml_collections; print(ml_collections.__file__)", WHEEL
  ], capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == os.path.join(WHEEL, "ml_collections",
                                             "__init__.py")
