r"""MAE against the paper's masked patch prediction and random init, on the
built-in digits, at the same pre-training wall time.

    .venv/bin/python -m benchmarks.mae_digits --seeds=0,1,2 \
        --out=/tmp/mae_digits.json

For each seed (config.seed of every run): configs/mae.py:digits and
configs/selfsup.py:digits pre-train the `digits` model without labels
(their wall times are reported: the MAE preset's steps are sized to take
about as long); then `vit-jax fewshot` (configs/fewshot.py:digits: the
class token, 10 shots, 3 samples) reads both and the model at random init;
then each of the three is fine-tuned on the labels with the same recipe
(configs/mae.py:digits_finetune: layer-wise lr decay, as MAE fine-tunes)
and its test accuracy reported. `--mae_steps` changes MAE's length.
"""

import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from benchmarks import train_run

FLAGS = flags.FLAGS
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (config.seed) to run.")
flags.DEFINE_integer("mae_steps", None, "MAE's steps (the preset's: None).")
flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir with digits.")

QUIET = [
    "--config.eval_every_steps=0", "--config.checkpoint_every_steps=100000"
]


def _pretrain(workdir: str, config: str, seed: int, steps=None) -> dict:
  args = [f"--config={config}", f"--workdir={workdir}", f"--config.seed={seed}"]
  args += QUIET + ([f"--config.total_steps={steps}"] if steps else [])
  run = train_run.train(args, FLAGS.data_dir)
  return {
      "wall_s": run.wall_s,
      "images_per_s": run.images_per_s(skip=1),
      "mae_loss": run.metric("mae/loss"),
      "masked_patch_accuracy": run.metric("masked_patch/accuracy"),
  }


def _fewshot(checkpoints: list[str], workdir: str) -> dict:
  command = [
      sys.executable, "-m", "vit_jax", "fewshot",
      "--config=configs/fewshot.py:digits", f"--workdir={workdir}",
      f"--checkpoints={','.join(checkpoints)}"
  ] + ([f"--config.data_dir={FLAGS.data_dir}"] if FLAGS.data_dir else [])
  done = subprocess.run(command, cwd=train_run.REPO, capture_output=True,
                        text=True)
  if done.returncode:
    raise SystemExit(done.stderr[-3000:])
  table = json.loads((pathlib.Path(workdir) / "fewshot.json").read_text())
  return {path: table[path]["digits"]["10shot"] for path in checkpoints}


def _finetune(workdir: str, init, seed: int) -> float:
  preset = "digits_finetune" + (f",init={init}" if init else "")
  run = train_run.train([
      f"--config=configs/mae.py:{preset}", f"--workdir={workdir}",
      f"--config.seed={seed}"
  ] + QUIET, FLAGS.data_dir)
  return run.metric("test/accuracy")


def _one_seed(tmp: pathlib.Path, seed: int) -> dict:
  mae_dir, mpp_dir = str(tmp / f"mae{seed}"), str(tmp / f"mpp{seed}")
  result = {
      "seed": seed,
      "mae": _pretrain(mae_dir, "configs/mae.py:digits", seed, FLAGS.mae_steps),
      "masked_patch": _pretrain(mpp_dir, "configs/selfsup.py:digits", seed),
  }
  tenshot = _fewshot([mae_dir, mpp_dir, "random"], str(tmp / f"fewshot{seed}"))
  for name, init in (("mae", mae_dir), ("masked_patch", mpp_dir), ("random",
                                                                   None)):
    result.setdefault(name, {})["10shot"] = tenshot[init or "random"]
    result[name]["finetuned"] = _finetune(str(tmp / f"ft_{name}{seed}"), init,
                                          seed)
  print(json.dumps(result), flush=True)
  return result


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as tmp:
    runs = [_one_seed(pathlib.Path(tmp), int(s)) for s in FLAGS.seeds]
  summary = {}
  for name in ("mae", "masked_patch", "random"):
    summary[name] = {
        key: (statistics.mean(r[name][key]
                              for r in runs), min(
                                  r[name][key]
                                  for r in runs), max(r[name][key]
                                                      for r in runs))
        for key in ("10shot", "finetuned", "wall_s")
        if all(r[name].get(key) is not None for r in runs)
    }
  text = json.dumps({"runs": runs, "mean_min_max": summary}, indent=1)
  print(text)
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(text + "\n")


if __name__ == "__main__":
  app.run(main)
