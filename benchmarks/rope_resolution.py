r"""Position embeddings at other resolutions, trained once: the paper's
Appendix D.4 question, with RoPE beside the learned and sin-cos tables.

    .venv/bin/python -m benchmarks.rope_resolution --seeds=0,1,2 \
        --out=/tmp/rope_resolution.json
    .venv/bin/python -m benchmarks.rope_resolution --forms="RoPE (mixed)"

For each position form and seed, `vit-jax train --config=configs/digits.py`
(the demo's 16-px model, 2,500 steps) with that form, then the trained
weights evaluated with no further training (`--config.total_steps=0
--config.init.checkpoint=WORKDIR`) at 16, 24 and 32 px: learned tables
resized to the new grid (bilinear, the loader's default), sin-cos tables
computed at it, RoPE (DINOv3's, timm's axial with and without a reference
grid, RoPE-ViT's mixed; no table) read at it as it is.
Printed: each run's test accuracies and wall time, then a table of the
means and ranges over the seeds.
"""

import json
import statistics
import tempfile

from absl import app
from absl import flags

from benchmarks import train_run

FLAGS = flags.FLAGS
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (config.seed) to run.")
flags.DEFINE_list("sizes", ["16", "24", "32"], "Evaluation resolutions.")
flags.DEFINE_integer("steps", None, "Training steps (the recipe's: None).")
flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir with digits.")
flags.DEFINE_list("forms", None, "Names of FORMS to run (None: all).")

FORMS = {
    "learned": ["--config.model.posemb=learn"],
    "sincos2d": ["--config.model.posemb=sincos2d"],
    "RoPE (dinov3)": [
        "--config.model.posemb=none", "--config.model.rope=dinov3"
    ],
    # timm's axial form: patch indices (RoPE-ViT's base, 100), and scaled
    # to the training grid (EVA's reference grid: 4 patches at 16 px).
    "RoPE (axial)": [
        "--config.model.posemb=none", "--config.model.rope=axial",
        "--config.model.rope_layout=interleaved"
    ],
    "RoPE (axial scaled to its training grid)": [
        "--config.model.posemb=none", "--config.model.rope=axial",
        "--config.model.rope_layout=interleaved",
        "--config.model.rope_reference_grid=4"
    ],
    # RoPE-ViT's mixed form: frequencies learned per block and head.
    "RoPE (mixed)": [
        "--config.model.posemb=none", "--config.model.rope=mixed",
        "--config.model.rope_layout=interleaved",
        "--config.model.rope_temperature=10"
    ],
    "none": ["--config.model.posemb=none"],
}


def _run(form: list[str], seed: int, folder: str) -> dict:
  workdir = f"{folder}/train"
  base = ["--config=configs/digits.py", f"--config.seed={seed}", *form]
  trained = train_run.train(
      base + [
          f"--workdir={workdir}", "--config.eval_every_steps=0",
          "--config.checkpoint_every_steps=100000"
      ] + ([f"--config.total_steps={FLAGS.steps}"] if FLAGS.steps else []),
      FLAGS.data_dir)
  out = {"wall_s": trained.wall_s}
  for size in FLAGS.sizes:
    evaluated = train_run.train(
        base + [
            f"--workdir={folder}/eval_{size}", f"--config.image_size={size}",
            "--config.total_steps=0", f"--config.init.checkpoint={workdir}"
        ], FLAGS.data_dir)
    out[size] = evaluated.metric("test/accuracy")
  return out


def main(argv):
  del argv
  results = {}
  for name, form in FORMS.items():
    if FLAGS.forms and name not in FLAGS.forms:
      continue
    runs = []
    for seed in FLAGS.seeds:
      with tempfile.TemporaryDirectory() as folder:
        runs.append(_run(form, int(seed), folder))
      print(f"{name} seed {seed}: {runs[-1]}", flush=True)
    results[name] = runs
  print("| position embeddings | " +
        " | ".join(f"{s} px" for s in FLAGS.sizes) + " |")
  print("|---|" + "---|" * len(FLAGS.sizes))
  for name, runs in results.items():
    cells = []
    for size in FLAGS.sizes:
      values = [100 * r[size] for r in runs]
      cells.append(f"{statistics.mean(values):.2f}% "
                   f"({min(values):.2f}-{max(values):.2f})")
    print(f"| {name} | " + " | ".join(cells) + " |")
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
