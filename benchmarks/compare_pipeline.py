r"""Input pipeline images/s, old path against new, on this machine in one run.

    .venv/bin/python benchmarks/compare_pipeline.py           # builds a folder
    .venv/bin/python benchmarks/compare_pipeline.py --folder=/data/pets \
        --runs=3 --batches=40

Without `--folder` it writes an ImageNet-like JPEG folder once (default
`/tmp/vit_jax_jpeg_folder`: 10 classes x 100 images, 300-500 px a side,
quality 75-95, cut from matplotlib's sample photograph at random scales and
positions) and reuses it. Each run is a fresh `python -m vit_jax
benchmark-input` at 224 px with `inception_crop|flip_lr|value_range`;
the variants (`--variant NAME=FLAGS`; by default the old path, then each
of the new options added in turn: decoding only the crop, uint8 hand-over,
bilinear crop resizing without antialias = today's defaults) alternate,
`--runs` times each, and the result is each one's median images/s.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from matplotlib import cbook
import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD = ("--config.pp_crop_on_decode=False --config.pp_crop_antialias=True "
       "--config.pp_uint8=False")
VARIANTS = [
    f"old={OLD}",
    ("crop on decode=--config.pp_crop_antialias=True "
     "--config.pp_uint8=False"),
    "+ uint8=--config.pp_crop_antialias=True",
    "new (defaults)=",
]


def build_folder(root: str, classes: int = 10, per_class: int = 100):
  """ROOT/train/class_<c>/<i>.jpg, unless ROOT exists already."""
  if os.path.isdir(root):
    return
  photo = Image.open(cbook.get_sample_data("grace_hopper.jpg",
                                           asfileobj=False)).convert("RGB")
  rng = np.random.default_rng(0)
  for c in range(classes):
    os.makedirs(os.path.join(root, "train", f"class_{c}"))
    for i in range(per_class):
      width, height = rng.integers(300, 501, 2)
      scale = rng.uniform(0.6, 1.0)
      w, h = int(photo.width * scale), int(photo.height * scale)
      left, top = rng.integers(0, photo.width - w + 1), rng.integers(
          0, photo.height - h + 1)
      image = photo.crop((left, top, left + w, top + h)).resize(
          (int(width), int(height)), Image.BICUBIC)
      image.save(os.path.join(root, "train", f"class_{c}", f"{i}.jpg"),
                 quality=int(rng.integers(75, 96)))


def run_pipeline(folder: str, batches: int, flags: list[str]) -> float:
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "benchmark-input",
      "--config=configs/digits.py", f"--config.dataset=folder:{folder}",
      "--config.image_size=224", "--config.cache=False",
      "--config.shuffle_buffer=1000", "--config.batch_size=64",
      "--config.pp_train=inception_crop|flip_lr|value_range",
      f"--batches={batches}", *flags
  ], cwd=REPO, check=True, capture_output=True, text=True)
  return json.loads(done.stdout.strip().splitlines()[-1])["images_per_sec"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--folder", help="An image folder (default: built).")
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--batches", type=int, default=40)
  parser.add_argument("--variant", action="append",
                      help="NAME=FLAG[ FLAG...] of vit-jax benchmark-input.")
  parser.add_argument("--out", help="Also write the result as JSON here.")
  args = parser.parse_args()
  folder = args.folder or "/tmp/vit_jax_jpeg_folder"
  if not args.folder:
    build_folder(folder)
  variants = [v.split("=", 1) for v in (args.variant or VARIANTS)]
  figures = {name: [] for name, _ in variants}
  for i in range(args.runs):
    for name, flags in variants:
      figures[name].append(run_pipeline(folder, args.batches, flags.split()))
    print(
        f"run {i + 1}: " +
        ", ".join(f"{name} {figures[name][-1]:.0f}" for name, _ in variants) +
        " img/s", flush=True)
  result = {
      "folder": folder,
      "runs": args.runs,
      "cpu_cores": os.cpu_count(),
      "images_per_sec": {
          name: statistics.median(values) for name, values in figures.items()
      },
      "all": figures
  }
  print(json.dumps(result, indent=1))
  if args.out:
    with open(args.out, "w") as f:
      f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
