"""The table of benchmarks/gpu_check.sh: ours and timm's runs side by side.

    python3 benchmarks/side_by_side.py DIR ROW...

Each ROW (e.g. ViT-B_16) has DIR/ROW.CODE.json for each code (ours, timm,
ours-fp8: ours with FP8 matmuls) when its run finished; a run that did not
gets its log's last line instead (DIR/ROW.CODE.log). Needs only Python.
"""

import json
import os
import sys

COLUMNS = ("model", "batch", "code", "images/s", "MFU", "peak GiB", "compile s",
           "loss")


def load(stem: str):
  """(STEM.json's result or None where the run did not finish, the last
  line of STEM.log)."""
  result = None
  if os.path.exists(stem + ".json"):
    with open(stem + ".json") as f:
      result = json.load(f)
  last = ""
  if os.path.exists(stem + ".log"):
    with open(stem + ".log", errors="replace") as f:
      lines = [line.strip() for line in f if line.strip()]
    last = lines[-1] if lines else ""
  return result, last


def _cells(result: dict) -> list:
  mfu, memory = result["mfu"], result["peak_device_memory_gib"]
  return [
      f"{result['images_per_sec']:,.1f}",
      f"{100 * mfu:.1f}%" if mfu is not None else "-",
      f"{memory:.1f}" if memory is not None else "-",
      f"{result['compile_s']:.0f}", f"{result['final_loss']:.3f}"
  ]


def aligned(columns, body: list) -> list:
  """The header and `body`'s rows as lines in aligned columns; a row with
  fewer cells (a failed run's message) runs on in its last."""
  full = [list(columns)] + [r for r in body if len(r) == len(columns)]
  widths = [max(len(r[i]) for r in full) for i in range(len(columns))]
  lines = []
  for cells in [list(columns)] + body:
    padded = [c.ljust(w) for c, w in zip(cells, widths)]
    lines.append("  ".join(padded[:len(cells) - 1] + cells[-1:]).rstrip())
  return lines


def table(folder: str, rows: list) -> str:
  lines, about = [], {}
  body = []
  for row in rows:
    for code in ("ours", "timm", "ours-fp8"):
      result, last = load(os.path.join(folder, f"{row}.{code}"))
      name = row.replace("_", "/")
      if result is None:
        body.append([name, "", code, f"failed: {last[:100]}"])
        continue
      about.update({
          k: v
          for k, v in result.items()
          if k.endswith("_version") or (k == "device" and code == "ours")
      })
      body.append([name, str(result["batch"]), code] + _cells(result))
  lines.append("gpu_check: " + ", ".join(
      f"{k.replace('_version', '')} {v}" for k, v in sorted(about.items())))
  return "\n".join(lines + aligned(COLUMNS, body))


if __name__ == "__main__":
  print(table(sys.argv[1], sys.argv[2:]))
