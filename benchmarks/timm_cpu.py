r"""timm's side of benchmarks/cpu_sweep.sh: training and inference speed of
timm's ViTs on this machine's CPU, as timm users run them there (eager).

    .venv-torch/bin/python benchmarks/timm_cpu.py --out=DIR --tag=timm [--dry]

For each case of `CASES` (the dry mode: `DRY_CASES`, the `testing`
model's sizes) writes DIR/CASE.TAG.json (CASE e.g. `Ti` for training
ViT-Ti/16, `S-b1` for ViT-S/16's inference at batch 1): images/s (the
median step of `--steps` after a warm-up one), the loss after each
training step, and torch's and timm's versions. Training is our
benchmark's step: fp32, Adam (lr 1e-3), softmax cross-entropy over 1,000
classes, random images in [-1, 1]; inference is `model.eval()` under
`torch.no_grad()`. timm builds the model from its widths (its
conventions: erf GELU, fused scaled-dot-product attention). Needs torch and
timm only.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Width, depth, heads, MLP width and patch size of the variants compared,
# as vit_jax/models/variants.py has them (a test keeps the two equal; this
# Python has no JAX to read them from).
SIZES = {
    "ViT-Ti/16": (192, 12, 3, 768, 16),
    "ViT-S/16": (384, 12, 6, 1536, 16),
    "ViT-B/16": (768, 12, 12, 3072, 16),
    "testing": (16, 2, 2, 32, 4),
}
# CASE -> (variant, batch, image size, training?).
CASES = {
    "Ti": ("ViT-Ti/16", 32, 224, True),
    "S": ("ViT-S/16", 32, 224, True),
    "Ti-b1": ("ViT-Ti/16", 1, 224, False),
    "Ti-b32": ("ViT-Ti/16", 32, 224, False),
    "S-b1": ("ViT-S/16", 1, 224, False),
    "S-b32": ("ViT-S/16", 32, 224, False),
}
DRY_CASES = {
    case: ("testing", min(batch, 8), 32, train)
    for case, (_, batch, _, train) in CASES.items()
}
TRAIN_STEPS, INFER_STEPS = 20, 10  # Timed; the dry mode: 3 and 2.


def _model(timm, variant: str, image_size: int):
  width, depth, heads, mlp, patch = SIZES[variant]
  return timm.models.vision_transformer.VisionTransformer(
      img_size=image_size, patch_size=patch, embed_dim=width, depth=depth,
      num_heads=heads, mlp_ratio=mlp / width, num_classes=1000)


def _timed(step, steps: int):
  """(the median seconds of `steps` calls after a warm-up one, each call's
  result)."""
  step()
  times, results = [], []
  for _ in range(steps):
    start = time.perf_counter()
    results.append(step())
    times.append(time.perf_counter() - start)
  return statistics.median(times), results


def run(timm, case: tuple, steps: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  variant, batch, image_size, train = case
  torch.manual_seed(0)
  model = _model(timm, variant, image_size)
  images = torch.rand(batch, 3, image_size, image_size) * 2 - 1
  if train:
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    labels = torch.randint(0, 1000, (batch,))

    def step():
      optimizer.zero_grad(set_to_none=True)
      loss = torch.nn.functional.cross_entropy(model(images), labels)
      loss.backward()
      optimizer.step()
      return loss.item()
  else:
    model.eval()

    def step():
      with torch.no_grad():
        return model(images)

  step_s, results = _timed(step, steps)
  return {
      "code": "timm",
      "variant": variant,
      "batch": batch,
      "image_size": image_size,
      "mode": "train" if train else "inference",
      "step_s": step_s,
      "images_per_sec": batch / step_s,
      "losses": results if train else None,
      "threads": torch.get_num_threads(),
      "device": platform.processor() or platform.machine(),
      "torch_version": torch.__version__,
      "timm_version": timm.__version__,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="The results' folder.")
  parser.add_argument("--tag", default="timm", help="DIR/CASE.TAG.json.")
  parser.add_argument("--dry", action="store_true",
                      help="The `testing` model's sizes, 32 px, few steps.")
  args = parser.parse_args()
  sys.path.insert(0, REPO)
  from tests.helpers import torch_reference  # pylint: disable=g-import-not-at-top
  timm = torch_reference.import_timm()  # Without torchvision where it breaks.
  for name, case in (DRY_CASES if args.dry else CASES).items():
    train = case[3]
    steps = (3 if train else 2) if args.dry else (
        TRAIN_STEPS if train else INFER_STEPS)
    result = run(timm, case, steps)
    with open(os.path.join(args.out, f"{name}.{args.tag}.json"), "w") as f:
      json.dump(result, f, indent=1)
    print(f"{name}: {result['images_per_sec']:.2f} images/s", flush=True)


if __name__ == "__main__":
  main()
