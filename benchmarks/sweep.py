"""The candidates of benchmarks/gpu_sweep.sh, run in one process: one start
of JAX and the GPU for all of them, XLA's options given to each step's
compilation alone (JAX's compiler_options), so a 15-minute GPU sitting
measures dozens of runs instead of a few.

    python3 benchmarks/sweep.py --out=DIR [--seconds=S] [--dry]
    python3 benchmarks/sweep.py --names [--dry]

Runs, in the order of `candidates()`, each candidate that DIR has no
result or log of yet: DIR/NAME.log says "started" while it runs, then
DIR/NAME.json holds its `vit-jax benchmark` result, or the log its error's
last line. A process that dies in a candidate (a hard crash, a timeout)
leaves "started" there; gpu_sweep.sh marks it and starts another process,
which goes on from the next. `--seconds`: start no candidate in the last
20 of them. `--names`: every candidate's name, in order. Needs jax, flax,
optax and ml_collections; no TensorFlow.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # This checkout's vit_jax.
sys.path.insert(0, HERE)
import sweep_table  # noqa: E402  (beside this file)

MODELS = {"B": ("ViT-B/16", 256), "L": ("ViT-L/16", 128)}
DRY_MODELS = {"B": ("testing", 8), "L": ("testing", 8)}
SECONDS_TO_START = 20  # Left in --seconds for one more candidate.


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One run: MODEL.RUN, and what it changes from the default."""
  name: str
  xla: dict = dataclasses.field(default_factory=dict)  # compiler_options
  model: dict = dataclasses.field(default_factory=dict)  # config.model
  mu_dtype: str = "float32"
  batch_scale: int = 1
  long: bool = False  # 200 steps (the dry mode: 25) instead of 20 (3).
  profile: bool = False  # Where the device time goes.
  # Compared with the fastest of these; () means MODEL.default and
  # MODEL.default_again.
  baselines: tuple = ()
  best: bool = False  # The settings that won on B, together.


# The settings that keep the model (candidates for a default), on B/16.
SETTINGS = (
    Candidate("B.no_triton_gemm", xla={"xla_gpu_enable_triton_gemm": False}),
    Candidate("B.mu_bf16", mu_dtype="bfloat16"),
    Candidate("B.cudnn_gemm_fusion",
              xla={"xla_gpu_cudnn_gemm_fusion_level": 2}),
    Candidate("B.cudnn_layer_norm",
              xla={"xla_gpu_enable_cudnn_layer_norm": True}),
    Candidate("B.latency_hiding",
              xla={"xla_gpu_enable_latency_hiding_scheduler": True}),
    Candidate("B.attention_xla", model={"attention": "xla"}),
)
PARALLEL, NO_BIAS = {"parallel_block": True}, {"use_bias": False}

# The dry mode's runs (the `testing` model on a CPU): every kind of run
# once (tests/test_gpu_sweep.py also compiles every candidate's options).
DRY = ("B.default", "L.default", "B.no_triton_gemm", "B.mu_bf16",
       "B.attention_xla", "B.default_again", "B.best", "B.parallel_block",
       "L.parallel_no_bias", "L.long_bf16", "L.long_fp8", "B.batch_2x")


def candidates(dry: bool = False) -> list:
  """Every run, most telling first: a budget running out drops the least
  (the dry mode: those of `DRY`)."""
  runs = [
      Candidate("B.default", profile=True),
      Candidate("L.default", profile=True),
      *SETTINGS,
      Candidate("B.default_again"),  # The default's own spread.
      Candidate("B.best", best=True),
      Candidate("L.best", best=True),
      # ViT-22B's block (changes the model: never a default).
      Candidate("B.parallel_block", model=PARALLEL),
      Candidate("L.parallel_block", model=PARALLEL),
      Candidate("B.no_bias", model=NO_BIAS),
      Candidate("L.parallel_no_bias", model={
          **PARALLEL,
          **NO_BIAS
      }),
      # FP8 against bf16 over 200 steps (the loss after them too).
      Candidate("L.long_bf16", long=True, baselines=("L.long_bf16",)),
      Candidate("L.long_fp8", model={"fp8": True}, long=True,
                baselines=("L.long_bf16",)),
      Candidate("B.batch_2x", batch_scale=2),
      Candidate("B.no_cuda_graphs", xla={"xla_gpu_enable_command_buffer": ""}),
      Candidate("B.qk_norm", model={"qk_norm": True}),
      Candidate("B.gelu_erf", model={"gelu_approximate": False}),
      Candidate("B.remat_dots", model={"remat": "dots"}),
      Candidate("B.exhaustive_tiling",
                xla={"xla_gpu_exhaustive_tiling_search": True}),
      Candidate("L.no_triton_gemm", xla={"xla_gpu_enable_triton_gemm": False}),
      Candidate("L.mu_bf16", mu_dtype="bfloat16"),
      Candidate("L.no_bias", model=NO_BIAS),
  ]
  return [c for c in runs if c.name in DRY] if dry else runs


def baselines(candidate: Candidate) -> list:
  model = candidate.name.split(".")[0]
  return list(candidate.baselines or
              (f"{model}.default", f"{model}.default_again"))


def _with_winners(candidate: Candidate, folder: str):
  """The `best` candidate: the settings that won on B together; None
  where none won."""
  won = sweep_table.winners(folder, "B", [c.name for c in SETTINGS])
  if not won:
    return None
  return dataclasses.replace(candidate, xla=won["xla"], model=won["model"],
                             mu_dtype=won["mu_dtype"])


def run(candidate: Candidate, dry: bool, folder: str) -> dict:
  del folder  # The result is all a GPU run keeps.
  from vit_jax.performance import speed  # pylint: disable=g-import-not-at-top
  model = candidate.name.split(".")[0]
  variant, batch = (DRY_MODELS if dry else MODELS)[model]
  steps = (25 if candidate.long else 3) if dry else (
      200 if candidate.long else 20)
  result = speed.run(variant, batch * candidate.batch_scale, 32 if dry else 224,
                     1000, steps, {
                         "dtype": "bfloat16",
                         **candidate.model
                     }, mu_dtype=candidate.mu_dtype,
                     profile_steps=3 if candidate.profile else 0,
                     compiler_options=candidate.xla)
  result["sweep"] = {"name": candidate.name, "baselines": baselines(candidate)}
  return result


def run_all(candidates_in_order: list, folder: str, seconds, prepare, run_one):
  """Runs each candidate that `folder` has no result or log of yet, in
  order (the protocol of the module doc), while `seconds` (None: no end)
  leave room to start one: `prepare(candidate)` gives what to run (None:
  not run, said in its log), `run_one` its result."""
  end = time.monotonic() + seconds if seconds else None
  for candidate in candidates_in_order:
    stem = os.path.join(folder, candidate.name)
    if os.path.exists(stem + ".json") or os.path.exists(stem + ".log"):
      continue  # Done, failed, or died in an earlier process.
    if end is not None and end - time.monotonic() < SECONDS_TO_START:
      return
    candidate = prepare(candidate)
    if candidate is None:
      with open(stem + ".log", "w") as log:
        log.write("not run: no setting was faster with the same results\n")
      continue
    with open(stem + ".log", "w") as log:
      log.write("started\n")
    print(f"== {candidate}", file=sys.stderr, flush=True)
    try:
      result = run_one(candidate)
    except Exception as error:  # pylint: disable=broad-except
      traceback.print_exc()
      with open(stem + ".log", "a") as log:
        log.write(f"{type(error).__name__}: {error}".replace("\n", " ") + "\n")
      continue
    with open(stem + ".json", "w") as f:
      json.dump(result, f, indent=1)


def main(doc: str, candidates_of, run_one, with_winners):
  """A sweep's command line (this one's and cpu_sweep.py's): the names of
  `candidates_of(dry)` in order, or each of them run into --out
  (`run_all`), a `best` one given the winners (`with_winners`)."""
  parser = argparse.ArgumentParser(description=doc.split("\n")[0])
  parser.add_argument("--out", help="The folder of results and logs.")
  parser.add_argument("--seconds", type=float, default=None,
                      help="Start no candidate in the last 20 of these.")
  parser.add_argument("--dry", action="store_true",
                      help="The tiny `testing` model at 32 px, few steps.")
  parser.add_argument("--names", action="store_true",
                      help="Print the candidates' names, in order.")
  args = parser.parse_args()
  if args.names:
    print(" ".join(c.name for c in candidates_of(args.dry)))
    return
  run_all(candidates_of(args.dry), args.out, args.seconds,
          lambda c: with_winners(c, args.out)
          if c.best else c, lambda c: run_one(c, args.dry, args.out))


if __name__ == "__main__":
  main(__doc__, candidates, run, _with_winners)
