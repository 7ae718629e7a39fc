"""The table of benchmarks/gpu_sweep.sh: each run against its model's
default from the same sitting, and DIR/sweep.json with every row.

    python3 benchmarks/sweep_table.py DIR NAME...
    python3 benchmarks/sweep_table.py --winners DIR MODEL NAME...

Each NAME is MODEL.RUN (e.g. B.no_triton_gemm); MODEL.default is the row
the others of MODEL are compared with, or MODEL.default_again where that
second run of the default was faster (a setting must beat both to win).
DIR/NAME.json holds a finished run (`vit-jax benchmark --out`); a run that
did not finish gets its log's last line. `--winners` prints the benchmark
flags of the NAMEs of MODEL that were faster than its default with the
same loss, combined, one per line (the sweep then runs them together).
Needs only Python.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side  # noqa: E402  (beside this file)

COLUMNS = ("model", "run", "batch", "images/s", "x default", "MFU", "peak GiB",
           "x default", "loss@20", "verdict")
COMPARED_STEP = 20  # The loss after this many timed steps is compared.
# The config.model fields that change the function the model computes: a
# run that changes one cannot become the default whatever its speed.
MODEL_FIELDS = ("parallel_block", "use_bias", "qkv_bias", "qk_norm",
                "gelu_approximate", "fp8")


def same_loss(loss: float, reference: float) -> bool:
  """Within 2% of the default's (0.01 where that is near zero): bf16 runs
  of one program differ by less; a changed update by more."""
  return abs(loss - reference) <= max(0.02 * abs(reference), 0.01)


def _load(folder: str, name: str):
  """(the JSON result or None, the log's last line)."""
  return side_by_side.load(os.path.join(folder, name))


def _default(folder: str, model: str):
  """The faster of MODEL.default and MODEL.default_again (None: neither)."""
  runs = [
      _load(folder, f"{model}.{name}")[0]
      for name in ("default", "default_again")
  ]
  runs = [r for r in runs if r is not None]
  return max(runs, key=lambda r: r["images_per_sec"]) if runs else None


def _loss_at(result: dict, step: int) -> float:
  losses = result.get("losses") or [result["final_loss"]]
  return losses[min(step, len(losses)) - 1]


def compare(result: dict, default, is_default: bool = False) -> dict:
  """The row's figures, each against `default` (None: no default ran)."""
  row = {
      "images_per_sec": result["images_per_sec"],
      "mfu": result["mfu"],
      "peak_gib": result["peak_device_memory_gib"],
      "loss_at_20": _loss_at(result, COMPARED_STEP),
      "final_loss": result["final_loss"],
      "steps": len(result.get("losses") or [None]),
  }
  if default is None:
    return row
  memory = default["peak_device_memory_gib"]
  row["speed_ratio"] = result["images_per_sec"] / default["images_per_sec"]
  row["memory_ratio"] = (row["peak_gib"] / memory
                         if memory and row["peak_gib"] is not None else None)
  reference = _loss_at(default, COMPARED_STEP)
  row["same_loss_at_20"] = same_loss(row["loss_at_20"], reference)
  changes = [f for f in MODEL_FIELDS if result.get(f) != default.get(f)]
  if is_default:
    row["verdict"] = "default"
  elif changes:
    row["verdict"] = "model differs (" + ", ".join(changes) + ")"
  elif result["batch"] != default["batch"] and row["speed_ratio"] > 1:
    row["verdict"] = "faster at another batch"
  elif row["speed_ratio"] >= 1.01:
    row["verdict"] = ("faster, same loss"
                      if row["same_loss_at_20"] else "faster, other loss")
  else:
    row["verdict"] = "not faster"
  if row["steps"] > COMPARED_STEP and len(
      default.get("losses") or ()) == row["steps"] and not is_default:
    row["same_final_loss"] = same_loss(result["final_loss"],
                                       default["final_loss"])
    row["verdict"] += (f"; after {row['steps']} steps "
                       f"{result['final_loss']:.3f} against "
                       f"{default['final_loss']:.3f}")
  return row


def _cells(row: dict) -> list:
  ratio = lambda r: f"{r:.3f}" if r is not None else "-"
  return [
      f"{row['images_per_sec']:,.1f}",
      ratio(row.get("speed_ratio")),
      f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "-",
      f"{row['peak_gib']:.1f}" if row["peak_gib"] is not None else "-",
      ratio(row.get("memory_ratio")), f"{row['loss_at_20']:.3f}",
      row.get("verdict", "")
  ]


def table(folder: str, names: list) -> str:
  body, rows, about = [], {}, {}
  for name in names:
    model, run = name.split(".", 1)
    result, last = _load(folder, name)
    default = _default(folder, model)
    if result is None:
      body.append([model, run, "", f"failed: {last[:100]}"])
      rows[name] = {"failed": last}
      continue
    about.update(device=result["device"], jax=result["jax_version"])
    row = compare(result, default, run.startswith("default"))
    rows[name] = {
        "variant": result["variant"],
        "batch": result["batch"],
        "result": result,
        **row
    }
    body.append([result["variant"], run, str(result["batch"])] + _cells(row))
  with open(os.path.join(folder, "sweep.json"), "w") as f:
    json.dump(rows, f, indent=1)
  lines = ["gpu_sweep: " + ", ".join(f"{k} {v}" for k, v in about.items())]
  full = [list(COLUMNS)] + [r for r in body if len(r) == len(COLUMNS)]
  widths = [max(len(r[i]) for r in full) for i in range(len(COLUMNS))]
  for cells in [list(COLUMNS)] + body:  # A failed run's message runs on.
    padded = [c.ljust(w) for c, w in zip(cells, widths)]
    lines.append("  ".join(padded[:len(cells) - 1] + cells[-1:]).rstrip())
  for name in names:  # Where the defaults' device time goes.
    profile = (rows[name].get("result") or {}).get("profile")
    if profile and profile.get("share_by_kind"):
      shares = sorted(profile["share_by_kind"].items(), key=lambda kv: -kv[1])
      lines.append(f"{name}: {profile['device_ms_per_step']:.1f} ms/step: " +
                   ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares))
  return "\n".join(lines)


def winners(folder: str, model: str, names: list) -> str:
  """The flags of `model`'s runs that won ("faster, same loss"), one per
  line, for one `vit-jax benchmark` command (XLA options joined)."""
  default = _default(folder, model)
  xla, flags = [], []
  for name in names:
    result, _ = _load(folder, name)
    if (default is None or result is None or
        compare(result, default)["verdict"] != "faster, same loss"):
      continue
    xla += result.get("xla_flags", "").split()
    for field in ("mu_dtype", "attention", "remat"):
      if result.get(field) != default.get(field):
        flags.append(f"--{field}={result[field]}")
  return "\n".join(flags + ([f"--xla_flags={' '.join(xla)}"] if xla else []))


if __name__ == "__main__":
  if sys.argv[1] == "--winners":
    flags = winners(sys.argv[2], sys.argv[3], sys.argv[4:])
    if flags:  # Nothing at all where none won: the sweep runs no `best`.
      print(flags)
  else:
    print(table(sys.argv[1], sys.argv[2:]))
