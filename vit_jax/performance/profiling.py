"""Where a jitted step's device time goes, read from JAX's own profiler.

`device_time_by_op(step, state, num_steps)` traces `num_steps` calls of
`step(state) -> (state, metrics)` with `jax.profiler.trace`, reads the
trace back (`jax.profiler.ProfileData`) and sums the duration of every op
the devices ran, by name and by kind (matmuls, fused attention, other
fusions, collectives, copies). Needs no TensorFlow and no TensorBoard.
"""

import collections
from pathlib import Path
import re
import tempfile

import jax

# Kind of an op, from its name (GPU kernels and XLA op names), first match.
_KINDS = (
    ("fused attention",
     re.compile(
         r"cudnn.*(fmha|flash|attention)|fmha|"
         r"flash|dot_product_attention", re.I)),
    ("matmul",
     re.compile(
         r"gemm|cublas|dot|matmul|convolution|\bconv\b|"
         r"conv_general|xmma|nvjet|cutlass", re.I)),
    ("collective",
     re.compile(
         r"all-reduce|all-gather|reduce-scatter|"
         r"all-to-all|nccl|collective", re.I)),
    ("copy/transpose", re.compile(r"copy|transpose|memcpy|memset", re.I)),
    ("other fusion", re.compile(r"fusion|loop_|input_|reduce", re.I)),
)

# The CPU runtime's spans around the ops (they would count them twice).
_WRAPPER = re.compile(r"ThunkExecutor|ThreadPool|Await")


def kind_of(name: str) -> str:
  return next((kind for kind, pattern in _KINDS if pattern.search(name)),
              "other")


def _has_events(plane) -> bool:
  return any(next(iter(line.events), None) is not None for line in plane.lines)


def _device_events(profile):
  """(name, duration ns) of the ops on accelerator planes; on a CPU-only
  run, the XLA ops of the host's thunk executor. (A device plane can be
  there and empty: libtpu, once loaded to compile for a TPU, adds its
  own.)"""
  planes = [
      p for p in profile.planes
      if p.name.startswith("/device:") and _has_events(p)
  ]
  if not planes:
    planes = [p for p in profile.planes if p.name.startswith("/host:")]
  for plane in planes:
    lines = list(plane.lines)
    ops = ([line for line in lines if line.name in ("XLA Ops", "Kernels")] or
           [line for line in lines if "XLA" in line.name] or lines)
    # Prefer GPU kernels (what ran) over the XLA op line that spans them.
    kernels = [line for line in ops if line.name == "Kernels"]
    for line in kernels or ops:
      for event in line.events:
        if not _WRAPPER.search(event.name):
          yield event.name, event.duration_ns


def device_time_by_op(step, state, num_steps: int, top: int = 15) -> dict:
  """Per step: total device time, shares by kind and the `top` ops."""
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir):
      for _ in range(num_steps):
        state, metrics = step(state)
      jax.block_until_ready(metrics)
    files = list(Path(logdir).rglob("*.xplane.pb"))
    if not files:
      return {"error": "the profiler wrote no trace"}
    profile = jax.profiler.ProfileData.from_file(str(files[0]))
    by_name = collections.Counter()
    for name, duration in _device_events(profile):
      by_name[name] += duration
  total = sum(by_name.values())
  if not total:
    return {"error": "the trace holds no device ops"}
  by_kind = collections.Counter()
  for name, duration in by_name.items():
    by_kind[kind_of(name)] += duration
  per_step_ms = lambda ns: ns / num_steps / 1e6
  return {
      "device_ms_per_step": per_step_ms(total),
      "share_by_kind": {
          k: v / total for k, v in by_kind.most_common()
      },
      "top_ops": [{
          "name": n[:120],
          "ms_per_step": per_step_ms(d),
          "share": d / total,
          "kind": kind_of(n)
      } for n, d in by_name.most_common(top)],
  }
