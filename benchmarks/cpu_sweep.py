"""The candidates of benchmarks/cpu_sweep.sh, run in one process: XLA's CPU
options given to each compiled step alone (JAX's compiler_options), and
our own choices (attention form, compute dtype, remat, batch), on
ViT-Ti/16 and ViT-S/16 training and on `predict`'s jitted forward.

    python3 benchmarks/cpu_sweep.py --out=DIR [--seconds=S] [--dry]
    python3 benchmarks/cpu_sweep.py --names [--dry]

Each candidate is CASE.RUN, CASE one of benchmarks/timm_cpu.py's (`Ti`,
`S`: training at batch 32; `Ti-b1`, `S-b32`, ...: inference at that
batch). A machine shared with others drifts by 10-20% within minutes, so
each run is timed in alternation with CASE's default (a step of one, a
step of the other), and compared (benchmarks/cpu_sweep_table.py) with the
default's steps timed between its own, and with timm's CASE. Runs each
that DIR has no result or log of yet (benchmarks/sweep.py's protocol: a
process that dies in one leaves "started" in its log, and cpu_sweep.sh
starts another that goes on from the next). A run's options are on top of
our CPU defaults (`hardware.CPU_COMPILER_OPTIONS`, which training,
evaluation and `predict` compile with), except the `xla_default` runs,
which have XLA's own alone.
"""

import dataclasses
import itertools
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # This checkout's vit_jax.
sys.path.insert(0, HERE)
import cpu_sweep_table  # noqa: E402  (beside this file)
import sweep  # noqa: E402
import timm_cpu  # noqa: E402

YNN = "xla_cpu_experimental_ynn_fusion_type"
ONEDNN_FUSIONS = "xla_cpu_experimental_onednn_fusion_type"
XNN_GRAPH = "xla_cpu_experimental_xnn_graph_fusion_mode"
_TYPES = lambda *kinds: ",".join(f"LIBRARY_FUSION_TYPE_{k}" for k in kinds)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One run: CASE.RUN, and what it changes from the default."""
  name: str
  xla: dict = dataclasses.field(default_factory=dict)  # compiler_options
  model: dict = dataclasses.field(default_factory=dict)  # config.model
  batch_scale: float = 1.0
  best: bool = False  # The settings that won on this case, together.
  # XLA's own options only, without the project's CPU defaults.
  xla_default: bool = False


# XLA's options that keep the function computed (candidates for a
# default): YNNPACK's fusions (XLA's default: single dots and convolutions,
# and reductions), oneDNN's, XNNPACK's graph fusion, the compiler's preset,
# scheduler and vector width, fast math.
XLA_SETTINGS = {
    "ynn_no_reduce": {
        YNN: _TYPES("INDIVIDUAL_DOT", "INDIVIDUAL_CONVOLUTION")
    },
    "ynn_off": {
        YNN: ""
    },
    "onednn_dots": {
        "xla_cpu_use_onednn": True,
        YNN: _TYPES("REDUCE"),
        ONEDNN_FUSIONS: _TYPES("DOT")
    },
    "onednn_custom_calls": {
        "xla_cpu_experimental_onednn_custom_call": True
    },
    "xnn_graph": {
        XNN_GRAPH: "XNN_GRAPH_FUSION_MODE_GREEDY"
    },
    "fast_runtime": {
        "xla_cpu_opt_preset": "CPU_OPT_PRESET_FAST_RUNTIME"
    },
    "concurrency_scheduler": {
        "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED"
    },
    "vector_512": {
        "xla_cpu_prefer_vector_width": 512
    },
    "fast_math": {
        "xla_cpu_enable_fast_math": True
    },
}
# Our own choices (config.model fields) that keep the model; bf16 compute
# changes the numbers a little (judged like the others).
MODEL_SETTINGS = {
    "attention_xla": {
        "attention": "xla"
    },
    "bf16": {
        "dtype": "bfloat16"
    },
    "remat": {
        "remat": "full"
    },
}
TRAINING, INFERENCE = ("Ti", "S"), ("S-b32", "S-b1", "Ti-b32", "Ti-b1")


def _settings(case: str, names) -> list:
  return [
      Candidate(f"{case}.{n}", xla=XLA_SETTINGS.get(n, {}),
                model=MODEL_SETTINGS.get(n, {})) for n in names
  ]


def settings_of(case: str) -> list:
  """The settings tried on `case` (what its `best` combines): all on
  Ti/16's training; on S/16's inference at batch 32 all but remat (no
  backward pass to save memory for), at batch 1 XLA's; S/16's training and
  Ti/16's inference take what won on Ti/16's training and S/16's
  inference."""
  if case == "Ti":
    return _settings(case, [*XLA_SETTINGS, *MODEL_SETTINGS])
  if case == "S-b32":
    return _settings(case, [*XLA_SETTINGS, "attention_xla", "bf16"])
  if case == "S-b1":
    return _settings(case, XLA_SETTINGS)
  return []


# The dry mode's runs (the `testing` model): each path once (training and
# inference, XLA's options and ours, another batch, XLA's own defaults, the
# winners together).
DRY = ("Ti.default", "S-b1.default", "Ti.ynn_no_reduce", "Ti.attention_xla",
       "Ti.batch_16", "S-b1.ynn_off", "Ti.xla_default", "Ti.best", "S-b1.best")


def candidates(dry: bool = False) -> list:
  """Every run, most telling first: a budget running out drops the least
  (the dry mode: those of `DRY`)."""
  runs = [
      *[Candidate(f"{c}.default") for c in TRAINING + INFERENCE],
      *settings_of("Ti"),
      Candidate("Ti.batch_16", batch_scale=0.5),
      Candidate("Ti.batch_64", batch_scale=2),
      *settings_of("S-b32"),
      *settings_of("S-b1"),
      *[
          Candidate(f"{c}.xla_default", xla_default=True)
          for c in TRAINING + INFERENCE
      ],
      *[Candidate(f"{c}.best", best=True) for c in TRAINING + INFERENCE],
  ]
  return [c for c in runs if c.name in DRY] if dry else runs


def _with_winners(candidate: Candidate, folder: str):
  """The `best` candidate: the settings that won on its case (see
  `settings_of`) together; None where none won."""
  case = candidate.name.split(".")[0]
  source = {"S": "Ti", "Ti-b32": "S-b32", "Ti-b1": "S-b1"}.get(case, case)
  won = cpu_sweep_table.winners(folder, [c.name for c in settings_of(source)])
  if not won:
    return None
  return dataclasses.replace(candidate, xla=won["xla"], model=won["model"])


_REFERENCES = {}  # CASE -> its default's step timer, kept for the process.


def _reference(case: str, dry: bool):
  """CASE's default run, one more step per call (`speed.step_timer`),
  timed between the candidate's steps."""
  from vit_jax.performance import speed  # pylint: disable=g-import-not-at-top
  if case not in _REFERENCES:
    variant, batch, image_size, train = (timm_cpu.DRY_CASES
                                         if dry else timm_cpu.CASES)[case]
    _REFERENCES[case] = speed.step_timer(variant, batch, image_size,
                                         {"dtype": "float32"},
                                         forward_only=not train)
  return _REFERENCES[case]


def run(candidate: Candidate, dry: bool, folder: str) -> dict:
  """The candidate's result, with the reference's steps timed between its
  own (`paired`)."""
  from vit_jax import hardware  # pylint: disable=g-import-not-at-top
  from vit_jax.performance import speed  # pylint: disable=g-import-not-at-top
  case = candidate.name.split(".")[0]
  variant, batch, image_size, train = (timm_cpu.DRY_CASES
                                       if dry else timm_cpu.CASES)[case]
  batch = max(1, int(batch * candidate.batch_scale))
  os.environ[hardware.DEFAULTS_VARIABLE] = "1"  # The reference: ours.
  reference, reference_s, calls = _reference(case, dry), [], itertools.count()

  def between():  # Training: after every other step (the half of the time).
    if not train or next(calls) % 2 == 0:
      reference_s.append(reference())

  # Our CPU defaults apply to every run but the xla_default ones.
  os.environ[hardware.DEFAULTS_VARIABLE] = "0" if candidate.xla_default else "1"
  defaults = hardware.compiler_options()
  model = {"dtype": "float32", **candidate.model}
  if train:
    steps = 3 if dry else timm_cpu.TRAIN_STEPS
    result = speed.run(variant, batch, image_size, 1000, steps, model,
                       compiler_options=candidate.xla, between=between)
  else:
    steps = 2 if dry else timm_cpu.INFER_STEPS
    result = speed.run_inference(variant, batch, image_size, 1000, steps, model,
                                 compiler_options=candidate.xla,
                                 between=between)
    cpu_sweep_table.keep_logits(folder, candidate.name, result.pop("logits"))
  os.environ[hardware.DEFAULTS_VARIABLE] = "1"
  reference_batch = (timm_cpu.DRY_CASES if dry else timm_cpu.CASES)[case][1]
  result["sweep"] = {
      "name": candidate.name,
      "baseline": f"{case}.default",
      "xla": candidate.xla,  # What the run changed (`best` combines).
      "model": candidate.model,
      "defaults": defaults,  # Ours, under the run's own.
      # The default's images/s, timed between this run's steps.
      "reference_images_per_sec": reference_batch /
                                  statistics.median(reference_s),
  }
  return result


if __name__ == "__main__":
  sweep.main(__doc__, candidates, run, _with_winners)
