"""The table of benchmarks/gpu_sweep.sh: each run against its baseline
from the same sitting, and DIR/sweep.json with every row.

    python3 benchmarks/sweep_table.py DIR NAME...

Each NAME is MODEL.RUN (e.g. B.no_triton_gemm). DIR/NAME.json holds a
finished run (`vit-jax benchmark`'s result, with the names of its
baselines under "sweep"; without them MODEL.default and
MODEL.default_again), compared with the fastest of its baselines that
finished: a setting must beat both runs of the default. A run that did not
finish gets its log's last line. Needs only Python.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side  # noqa: E402  (beside this file)

COLUMNS = ("model", "run", "batch", "steps", "images/s", "x base", "MFU",
           "step MiB", "x base", "loss@20", "verdict")
COMPARED_STEP = 20  # The loss after this many timed steps is compared.
# The config.model fields that change the function the model computes: a
# run that changes one cannot become the default whatever its speed.
MODEL_FIELDS = ("parallel_block", "use_bias", "qkv_bias", "qk_norm",
                "gelu_approximate", "fp8")
# The fields a setting may change, as the sweep's candidates spell them.
SETTING_FIELDS = ("attention", "remat")


def same_loss(loss: float, reference: float) -> bool:
  """Within 2% of the baseline's (0.01 where that is near zero): bf16 runs
  of one program differ by less; a changed update by more."""
  return abs(loss - reference) <= max(0.02 * abs(reference), 0.01)


def _load(folder: str, name: str):
  """(the JSON result or None, the log's last line)."""
  return side_by_side.load(os.path.join(folder, name))


def _baselines(result: dict) -> list:
  model = result.get("sweep", {}).get("name", "B.").split(".")[0]
  return result.get("sweep", {}).get(
      "baselines", [f"{model}.default", f"{model}.default_again"])


def baseline(folder: str, result: dict):
  """The fastest of `result`'s baselines that finished (None: none)."""
  runs = [_load(folder, name)[0] for name in _baselines(result)]
  runs = [r for r in runs if r is not None]
  return max(runs, key=lambda r: r["images_per_sec"]) if runs else None


def loss_at(result: dict, step: int) -> float:
  losses = result.get("losses") or [result["final_loss"]]
  return losses[min(step, len(losses)) - 1]


def _step_mib(result: dict):
  """The compiled step's own memory (XLA's account: arguments, outputs,
  temporaries), the same on every run of it, unlike a process's peak."""
  memory = result.get("compiled_memory")
  return memory["total_bytes"] / 2**20 if memory else None


def compare(result: dict, base, is_baseline: bool = False) -> dict:
  """The row's figures, each against `base` (None: no baseline ran)."""
  row = {
      "images_per_sec": result["images_per_sec"],
      "mfu": result["mfu"],
      "step_mib": _step_mib(result),
      "loss_at_20": loss_at(result, COMPARED_STEP),
      "final_loss": result["final_loss"],
      "steps": len(result.get("losses") or [None]),
  }
  if base is None:
    row["verdict"] = "no baseline ran"
    return row
  row["speed_ratio"] = result["images_per_sec"] / base["images_per_sec"]
  base_mib = _step_mib(base)
  row["memory_ratio"] = (row["step_mib"] /
                         base_mib if base_mib and row["step_mib"] else None)
  same_length = len(base.get("losses") or [None]) == row["steps"]
  if same_length:  # The schedule decays over the run: equal lengths only.
    row["same_loss_at_20"] = same_loss(row["loss_at_20"],
                                       loss_at(base, COMPARED_STEP))
  changes = [f for f in MODEL_FIELDS if result.get(f) != base.get(f)]
  if is_baseline:
    row["verdict"] = "baseline"
  elif changes:
    row["verdict"] = "model differs (" + ", ".join(changes) + ")"
  elif result["batch"] != base["batch"]:
    row["verdict"] = "another batch"
  elif row["speed_ratio"] < 1.01:
    row["verdict"] = "not faster"
  elif not same_length:
    row["verdict"] = "faster, another length"
  else:
    row["verdict"] = ("faster, same loss"
                      if row["same_loss_at_20"] else "faster, other loss")
  if same_length and row["steps"] > COMPARED_STEP and not is_baseline:
    row["same_final_loss"] = same_loss(result["final_loss"], base["final_loss"])
    row["verdict"] += (f"; after {row['steps']} steps "
                       f"{result['final_loss']:.3f} against "
                       f"{base['final_loss']:.3f}")
  return row


def winners(folder: str, model: str, names: list) -> dict:
  """What `model`'s runs among `names` that won ("faster, same loss")
  changed, together: {"xla": compiler options, "model": config.model
  fields, "mu_dtype": ...}; {} where none won."""
  won = {"xla": {}, "model": {}, "mu_dtype": "float32"}
  for name in names:
    result, _ = _load(folder, name)
    if result is None or not name.startswith(model + "."):
      continue
    base = baseline(folder, result)
    if compare(result, base)["verdict"] != "faster, same loss":
      continue
    won["xla"].update(result.get("compiler_options") or {})
    won["model"].update(
        {f: result[f] for f in SETTING_FIELDS if result.get(f) != base.get(f)})
    if result.get("mu_dtype") != base.get("mu_dtype"):
      won["mu_dtype"] = result["mu_dtype"]
  return won if (won["xla"] or won["model"] or
                 won["mu_dtype"] != "float32") else {}


def _cells(row: dict) -> list:
  ratio = lambda r: f"{r:.3f}" if r is not None else "-"
  return [
      str(row["steps"]), f"{row['images_per_sec']:,.1f}",
      ratio(row.get("speed_ratio")),
      f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "-",
      f"{row['step_mib']:,.0f}" if row["step_mib"] is not None else "-",
      ratio(row.get("memory_ratio")), f"{row['loss_at_20']:.3f}", row["verdict"]
  ]


def table(folder: str, names: list) -> str:
  body, rows, about = [], {}, {}
  for name in names:
    model = name.split(".", 1)[0]
    result, last = _load(folder, name)
    if result is None:
      why = f"failed: {last[:100]}" if last else "not run: the budget ran out"
      body.append([model, name, "", why])
      rows[name] = {"failed": why}
      continue
    about.update(device=result["device"], jax=result["jax_version"])
    row = compare(result, baseline(folder, result), name in _baselines(result))
    rows[name] = {"variant": result["variant"], "result": result, **row}
    body.append([result["variant"], name, str(result["batch"])] + _cells(row))
  with open(os.path.join(folder, "sweep.json"), "w") as f:
    json.dump(rows, f, indent=1)
  lines = ["gpu_sweep: " + ", ".join(f"{k} {v}" for k, v in about.items())]
  lines += side_by_side.aligned(COLUMNS, body)
  for name in names:  # Where the defaults' device time goes.
    profile = (rows[name].get("result") or {}).get("profile")
    if profile and profile.get("share_by_kind"):
      shares = sorted(profile["share_by_kind"].items(), key=lambda kv: -kv[1])
      lines.append(f"{name}: {profile['device_ms_per_step']:.1f} ms/step: " +
                   ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares))
  return "\n".join(lines)


if __name__ == "__main__":
  print(table(sys.argv[1], sys.argv[2:]))
