r"""timm's training step on the model and batch of one of our benchmark runs.

    python3 benchmarks/timm_speed.py --like=ours.json --out=timm.json

`--like` is what `vit-jax benchmark --out` wrote. timm builds a ViT of the
same widths, depth, heads, patch size, image size and classes (with its
own conventions: erf GELU, fused scaled-dot-product attention) and trains
it on random data with the same global batch, the way timm users train
fast: `torch.compile`, bf16 autocast when ours computed in bf16 (fp32
parameters, like ours), fused AdamW, TF32 for what stays fp32. MFU counts
the model FLOPs ours counts (6 x our forward multiply-adds per image)
against the same peak, so the two MFUs compare like the images/s.

Prints one JSON object (and writes it to `--out`). Needs torch and timm
only; `benchmarks/gpu_check.sh` runs it after ours, and `--steps=2` with
our `testing` model makes it a quick CPU check.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP_STEPS = 2  # The first compiles; the second may compile what the
# first left for later (the optimizer's fused kernels).


def build(like: dict, device: str):
  if like["hybrid"]:
    raise SystemExit(f"error: {like['variant']} is a hybrid; timm_speed.py "
                     "builds plain ViTs only.")
  if like.get("parallel_block") or not like.get("use_bias", True):
    raise SystemExit("error: timm_speed.py builds timm's sequential block "
                     "with biases; run ours without --parallel_block and "
                     "--nouse_bias to compare.")
  sys.path.insert(0, REPO)
  from tests.helpers import torch_reference  # pylint: disable=g-import-not-at-top
  timm = torch_reference.import_timm()  # Without torchvision where it breaks.
  options = {
      "qkv_bias": like.get("qkv_bias", True),
      "qk_norm": like.get("qk_norm", False)
  }
  model = timm.models.vision_transformer.VisionTransformer(
      img_size=like["image_size"], patch_size=like["patch_size"],
      embed_dim=like["hidden_size"], depth=like["num_layers"],
      num_heads=like["num_heads"],
      mlp_ratio=like["mlp_dim"] / like["hidden_size"],
      num_classes=like["num_classes"], **options)
  return model.to(device).train(), timm.__version__


def run(like: dict, steps: int, compile_backend: str = "inductor") -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  cuda = torch.cuda.is_available()
  device = "cuda" if cuda else "cpu"
  torch.manual_seed(0)
  torch.set_float32_matmul_precision("high")  # TF32, as JAX's default.
  model, timm_version = build(like, device)
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
  compiled = torch.compile(model, backend=compile_backend)
  batch, size = like["batch"], like["image_size"]
  images = torch.rand(batch, 3, size, size, device=device) * 2 - 1
  labels = torch.randint(0, like["num_classes"], (batch,), device=device)
  bf16 = like["dtype"] == "bfloat16"
  sync = torch.cuda.synchronize if cuda else lambda: None

  def step():
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
      logits = compiled(images)
    loss = F.cross_entropy(logits.float(), labels)  # The loss in fp32.
    loss.backward()
    optimizer.step()
    return loss

  start = time.perf_counter()
  for _ in range(WARMUP_STEPS):
    step()
  sync()
  compile_s = time.perf_counter() - start
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    loss = step()
    sync()
    times.append(time.perf_counter() - start)
  images_per_sec = batch / statistics.median(times)
  model_tflops = images_per_sec * 6 * like["forward_gmacs_per_image"] / 1e3
  peak = like["peak_tflops_per_device"]
  return {
      "code": "timm",
      "variant": like["variant"],
      "batch": batch,
      "image_size": size,
      "dtype": like["dtype"],
      "parameters": sum(p.numel() for p in model.parameters()),
      "device": torch.cuda.get_device_name() if cuda else platform.processor(),
      "torch_version": torch.__version__,
      "timm_version": timm_version,
      "compile_backend": compile_backend,
      "compile_s": compile_s,
      "step_s": statistics.median(times),
      "images_per_sec": images_per_sec,
      "model_tflops_per_sec": model_tflops,
      "mfu": model_tflops / peak if peak else None,
      "peak_device_memory_gib": (
          torch.cuda.max_memory_allocated() / 2**30 if cuda else None),
      "final_loss": float(loss),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--like", required=True,
                      help="JSON of `vit-jax benchmark --out`.")
  parser.add_argument("--steps", type=int, default=20, help="Timed steps.")
  parser.add_argument("--out", help="Also write the JSON result here.")
  parser.add_argument(
      "--compile_backend", default="inductor",
      help="torch.compile's backend; the dry run on CPU uses 'eager' (its "
      "graph capture without a minute of C++ code generation).")
  args = parser.parse_args()
  with open(args.like) as f:
    like = json.load(f)
  if like["num_devices"] != 1:
    raise SystemExit("error: timm_speed.py compares one device; "
                     f"{args.like} ran on {like['num_devices']}.")
  text = json.dumps(run(like, args.steps, args.compile_backend), indent=1)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
