r"""Whether a long run's host memory stays flat: the resident memory of a
`vit-jax train` process read at chosen steps.

    .venv/bin/python benchmarks/host_memory.py --steps=500,10000 \
        --workdir=/tmp/host_memory -- --config=configs/digits.py

Starts the train command (the flags after `--`, plus `--workdir`, a total of
the largest step and a log line every `--every` steps) afresh, follows its
console, and reads the process's resident set (VmRSS, /proc) when it logs
each step named. Prints one JSON line per step read and, last, the growth
from the first step named to the last.
"""

import json
import os
import re
import shutil
import subprocess
import sys

from absl import app
from absl import flags

flags.DEFINE_list("steps", ["500", "10000"], "Steps at which to read memory.")
flags.DEFINE_integer("every", 100, "Log (and checkpoint) every N steps.")
flags.DEFINE_string("workdir", "/tmp/vit_jax_host_memory",
                    "Workdir (emptied first).")
FLAGS = flags.FLAGS


def resident_mib(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    kib = re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)
  return int(kib) / 1024


def main(argv):
  steps = sorted(int(s) for s in FLAGS.steps)
  shutil.rmtree(FLAGS.workdir, ignore_errors=True)
  command = [
      os.path.join(os.path.dirname(sys.executable),
                   "vit-jax"), "train", *argv[1:], f"--workdir={FLAGS.workdir}",
      f"--config.total_steps={steps[-1]}",
      f"--config.log_every_steps={FLAGS.every}"
  ]
  child = subprocess.Popen(command, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={
                               **os.environ, "PYTHONUNBUFFERED": "1"
                           })  # Each line as it is logged.
  read = {}
  for line in child.stdout:
    logged = re.search(r"Step (\d+)/\d+: loss", line)
    if logged and int(logged.group(1)) in steps:
      step = int(logged.group(1))
      read[step] = resident_mib(child.pid)
      print(json.dumps({
          "step": step,
          "resident_mib": round(read[step], 1)
      }), flush=True)
  if child.wait() != 0:
    sys.exit(f"the train command failed (exit {child.returncode})")
  first, last = read[steps[0]], read[steps[-1]]
  print(
      json.dumps({
          "growth_percent": round(100 * (last - first) / first, 2),
          "from_step": steps[0],
          "to_step": steps[-1]
      }))


if __name__ == "__main__":
  app.run(main)
