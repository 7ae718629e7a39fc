"""The table of benchmarks/cpu_sweep.sh: each run against the default of its
case, timed in alternation with it, and against timm's; DIR/sweep.json.

    python3 benchmarks/cpu_sweep_table.py DIR NAME...

Each NAME is CASE.RUN (benchmarks/cpu_sweep.py). DIR/NAME.json holds a
finished run, with the default's images/s timed between its steps
(`sweep.reference_images_per_sec`): "x base" is the run's images/s over
that. DIR/CASE.timm.json and DIR/CASE.timm_again.json are timm's runs
(benchmarks/timm_cpu.py, before and after ours): "x timm" is the run's
images/s over the faster. A training run keeps the model when its loss
after 20 steps is within sweep_table's tolerance of CASE.default's; an
inference run when its logits are within `LOGITS_TOLERANCE` of
CASE.default's (DIR/NAME.npy). A run wins ("faster, same loss" or "same
logits") at `WIN` x base or more. Needs numpy.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side  # noqa: E402  (beside this file)
import sweep_table  # noqa: E402

COLUMNS = ("case", "run", "batch", "images/s", "x base", "x timm",
           "loss@20 | logits", "verdict")
# The most an inference run's logits may differ from its default's, in
# units of the default's largest logit: float32 sums in another order
# differ by about 1e-6 of it; another function by far more.
LOGITS_TOLERANCE = 1e-4
# Faster than the default timed beside it by this much: the default timed
# beside itself spreads by about 2% on a shared 2-core machine.
WIN = 1.03
TIMM_TAGS = ("timm", "timm_again")


def keep_logits(folder: str, name: str, logits):
  np.save(os.path.join(folder, f"{name}.npy"), np.asarray(logits, np.float32))


def _logits(folder: str, name: str):
  path = os.path.join(folder, f"{name}.npy")
  return np.load(path) if os.path.exists(path) else None


def _load(folder: str, name: str):
  return side_by_side.load(os.path.join(folder, name))


def timm(folder: str, case: str):
  """The faster of timm's two runs of `case` (None: neither finished)."""
  runs = [_load(folder, f"{case}.{tag}")[0] for tag in TIMM_TAGS]
  runs = [r for r in runs if r is not None]
  return max(runs, key=lambda r: r["images_per_sec"]) if runs else None


def _same_results(folder: str, name: str, result: dict, base: dict) -> dict:
  """The run's results against its case's default's: the loss after 20
  steps (training), or the largest logit difference (inference)."""
  if result["mode"] == "train":
    loss = sweep_table.loss_at(result, sweep_table.COMPARED_STEP)
    return {
        "loss_at_20": loss,
        "same": sweep_table.same_loss(
            loss, sweep_table.loss_at(base, sweep_table.COMPARED_STEP))
    }
  mine, theirs = _logits(folder, name), _logits(folder, base["sweep"]["name"])
  if mine is None or theirs is None or mine.shape != theirs.shape:
    return {"same": False}
  difference = float(np.max(np.abs(mine - theirs)))
  return {
      "max_logit_difference": difference,
      "same": difference <= LOGITS_TOLERANCE * float(np.max(np.abs(theirs)))
  }


def compare(folder: str, name: str, result: dict) -> dict:
  """The row's figures against its case's default and timm's run."""
  run = result["sweep"]
  row = {
      "images_per_sec": result["images_per_sec"],
      "speed_ratio": result["images_per_sec"] / run["reference_images_per_sec"]
  }
  base, _ = _load(folder, run["baseline"])
  theirs = timm(folder, name.split(".")[0])
  if theirs is not None and theirs["batch"] == result["batch"]:
    row["timm_images_per_sec"] = theirs["images_per_sec"]
    row["timm_ratio"] = result["images_per_sec"] / theirs["images_per_sec"]
  if base is None:
    return {**row, "verdict": "its default did not run"}
  row.update(_same_results(folder, name, result, base))
  kind = "loss" if result["mode"] == "train" else "logits"
  if name == run["baseline"]:
    row["verdict"] = "baseline"
  elif result["batch"] != base["batch"]:
    row["verdict"] = "another batch"
  elif row["speed_ratio"] < WIN:
    row["verdict"] = "not faster"
  else:
    row["verdict"] = f"faster, {'same' if row['same'] else 'other'} {kind}"
  return row


def won(row: dict) -> bool:
  return row.get("verdict") in ("faster, same loss", "faster, same logits")


def winners(folder: str, names: list) -> dict:
  """What the runs among `names` that won changed, together: {"xla":
  compiler options, "model": config.model fields}; {} where none won."""
  together = {"xla": {}, "model": {}}
  for name in names:
    result, _ = _load(folder, name)
    if result is None or not won(compare(folder, name, result)):
      continue
    together["xla"].update(result["sweep"]["xla"])
    together["model"].update(result["sweep"]["model"])
  return together if together["xla"] or together["model"] else {}


def _cells(result: dict, row: dict) -> list:
  ratio = lambda r: f"{r:.3f}" if r is not None else "-"
  if "loss_at_20" in row:
    quality = f"{row['loss_at_20']:.4f}"
  elif "max_logit_difference" in row:
    quality = f"{row['max_logit_difference']:.1e}"
  else:
    quality = "-"
  return [
      str(result["batch"]), f"{row['images_per_sec']:,.2f}",
      ratio(row.get("speed_ratio")),
      ratio(row.get("timm_ratio")), quality, row["verdict"]
  ]


def _timm_row(case: str, theirs: dict) -> list:
  loss = f"{theirs['losses'][-1]:.4f}" if theirs["losses"] else "-"
  return [
      case, f"{case}.timm",
      str(theirs["batch"]), f"{theirs['images_per_sec']:,.2f}", "-", "1.000",
      loss, "timm (eager)"
  ]


def table(folder: str, names: list) -> str:
  body, rows, about = [], {}, {}
  for name in names:
    case = name.split(".", 1)[0]
    result, last = _load(folder, name)
    if result is None:
      why = f"failed: {last[:100]}" if last else "not run: the budget ran out"
      body.append([case, name, "", why])
      rows[name] = {"failed": why}
      continue
    about.update(device=result["device"], jax=result["jax_version"])
    row = compare(folder, name, result)
    rows[name] = {"variant": result["variant"], "result": result, **row}
    body.append([case, name] + _cells(result, row))
  for case in dict.fromkeys(n.split(".", 1)[0] for n in names):
    theirs = timm(folder, case)
    if theirs is not None:
      about.update(torch=theirs["torch_version"], timm=theirs["timm_version"])
      rows[f"{case}.timm"] = theirs
      body.append(_timm_row(case, theirs))
  with open(os.path.join(folder, "sweep.json"), "w") as f:
    json.dump(rows, f, indent=1)
  lines = ["cpu_sweep: " + ", ".join(f"{k} {v}" for k, v in about.items())]
  return "\n".join(lines + side_by_side.aligned(COLUMNS, body))


if __name__ == "__main__":
  print(table(sys.argv[1], sys.argv[2:]))
