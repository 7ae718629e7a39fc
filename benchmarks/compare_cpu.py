r"""Training speed of ours against timm on this machine, in one run.

    .venv/bin/python benchmarks/compare_cpu.py               # ViT-Ti/16
    .venv/bin/python benchmarks/compare_cpu.py --runs=3 --steps=8 \
        --ours_env=XLA_FLAGS=--xla_cpu_use_onednn=true

Each run is a fresh process: ours is `python3 -m vit_jax benchmark` (the
train step of `vit-jax train`: fp32, Adam, softmax cross-entropy, synthetic
data), timm's the same model with torch.optim.Adam, eager
(benchmarks/timm_cpu.py's step: timm's VisionTransformer, erf GELU as
timm has it). The two alternate, `--runs` times each, so both see the
same machine state; each run's figure is the median
step time of `--steps` steps after one warm-up step, and the result is the
median over runs. timm runs in `--torch_python` (default `.venv-torch`,
which `make test` builds where torch's CPU build is at hand:
tests/references/torch_env.sh).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("ViT-Ti/16", "ViT-S/16", "ViT-B/16")

# timm's training step: benchmarks/timm_cpu.py's, on (variant, batch, size).
_TIMM_STEP = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/benchmarks"]
import timm_cpu
from tests.helpers import torch_reference  # timm, without torchvision.
variant, (batch, size, steps) = sys.argv[2], map(int, sys.argv[3:6])
timm = torch_reference.import_timm()
print(json.dumps(timm_cpu.run(timm, (variant, batch, size, True), steps)))
"""


def run_ours(args, env) -> float:
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    subprocess.run([
        sys.executable, "-m", "vit_jax", "benchmark",
        f"--variant={args.variant}", f"--batch={args.batch}",
        f"--image_size={args.image_size}", f"--steps={args.steps}",
        f"--out={out.name}", *args.ours_flag
    ], cwd=REPO, env=env, check=True, capture_output=True)
    return json.load(open(out.name))["images_per_sec"]


def run_timm(args) -> float:
  done = subprocess.run([
      args.torch_python, "-c", _TIMM_STEP, REPO, args.variant,
      str(args.batch),
      str(args.image_size),
      str(args.steps)
  ], check=True, capture_output=True, text=True)
  return json.loads(done.stdout.strip().splitlines()[-1])["images_per_sec"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--variant", default="ViT-Ti/16", choices=VARIANTS)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--ours_env", action="append", default=[],
                      help="NAME=VALUE for our runs (e.g. XLA_FLAGS=...).")
  parser.add_argument("--ours_flag", action="append", default=[],
                      help="An extra flag of vit-jax benchmark.")
  parser.add_argument("--skip_timm", action="store_true")
  parser.add_argument(
      "--torch_python", default=os.path.join(REPO, ".venv-torch", "bin",
                                             "python"),
      help="A Python with torch and timm.")
  parser.add_argument("--out", help="Also write the result as JSON here.")
  args = parser.parse_args()
  env = dict(os.environ, **dict(e.split("=", 1) for e in args.ours_env))
  ours, timm = [], []
  for i in range(args.runs):
    ours.append(run_ours(args, env))
    if not args.skip_timm:
      timm.append(run_timm(args))
    print(
        f"run {i + 1}: ours {ours[-1]:.2f} img/s" +
        (f", timm {timm[-1]:.2f} img/s" if timm else ""), flush=True)
  result = {
      "variant": args.variant,
      "batch": args.batch,
      "image_size": args.image_size,
      "runs": args.runs,
      "ours_env": args.ours_env,
      "ours_flags": args.ours_flag,
      "ours_images_per_sec": statistics.median(ours),
      "ours_all": ours
  }
  if timm:
    result.update(timm_images_per_sec=statistics.median(timm), timm_all=timm,
                  ratio=statistics.median(ours) / statistics.median(timm))
  print(json.dumps(result, indent=1))
  if args.out:
    with open(args.out, "w") as f:
      f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
