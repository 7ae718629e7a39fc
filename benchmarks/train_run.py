"""One `vit-jax train` process, timed: what the benchmarks that compare
training runs (naflex_packing.py, distill_digits.py) read of each."""

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class TrainRun:
  log: str  # Its stderr and stdout.
  wall_s: float

  def metric(self, name: str) -> Optional[float]:
    """The last value the run printed as NAME=VALUE; None if none."""
    found = re.findall(rf"{re.escape(name)}=([\d.e-]+)", self.log)
    return float(found[-1]) if found else None

  def images_per_s(self, skip: int = 0) -> float:
    """The median of the logged steps' images/s after the first `skip`."""
    speeds = [float(s) for s in re.findall(r"([\d.]+) images/s", self.log)]
    return statistics.median(speeds[skip:] or speeds)


def train(flags: list[str], data_dir: Optional[str] = None) -> TrainRun:
  """Runs `vit-jax train FLAGS` on the CPU from the repository; a failed
  run ends the benchmark with its stderr."""
  command = [sys.executable, "-m", "vit_jax", "train", *flags]
  if data_dir:
    command.append(f"--config.data_dir={data_dir}")
  start = time.time()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env={
      **os.environ, "JAX_PLATFORMS": "cpu"
  })
  wall = time.time() - start
  if done.returncode:
    raise SystemExit(done.stderr[-3000:])
  return TrainRun(done.stderr + done.stdout, round(wall, 1))
