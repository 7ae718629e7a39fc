"""benchmarks/gpu_sweep.sh: its dry mode on CPU runs each kind of candidate
into one table, which judges each run against the default of the same
sitting; every candidate's XLA options and model options are taken."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import processes
from vit_jax.errors import UserError
from vit_jax.performance import speed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(name: str):
  """A script of benchmarks/ as a module."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(REPO, "benchmarks", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


sweep_table, sweep = _module("sweep_table"), _module("sweep")


def test_dry_sweep_runs_each_kind_of_candidate_into_one_table(tmp_path):
  # A budget no slow machine spends: every candidate of the dry mode runs.
  env = processes.command_env(PYTHON=sys.executable, OUT=str(tmp_path),
                              BUDGET="3000")
  done = subprocess.run(
      [os.path.join(REPO, "benchmarks", "gpu_sweep.sh"), "--dry"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert lines[0].startswith("gpu_sweep: device cpu, jax "), lines
  assert lines[1].split()[:5] == ["model", "run", "batch", "steps", "images/s"]
  rows = json.loads((tmp_path / "sweep.json").read_text())
  names = [c.name for c in sweep.candidates(dry=True)]
  assert list(rows) == names == list(sweep.DRY)
  # Every candidate ran (XLA's options too: an unknown one fails its
  # compilation), except `best` where no setting won.
  failed = {n: r["failed"] for n, r in rows.items() if "failed" in r}
  assert set(failed) <= {"B.best"}, failed
  assert all("no setting was faster" in why for why in failed.values())
  settings = [c.name for c in sweep.SETTINGS]
  won = sweep_table.winners(str(tmp_path), "B", settings)
  for name, row in rows.items():
    if name in failed:
      continue
    candidate = next(c for c in sweep.candidates(True) if c.name == name)
    if candidate.best:  # The settings that won, together.
      candidate = dataclasses.replace(candidate, xla=won["xla"],
                                      model=won["model"],
                                      mu_dtype=won["mu_dtype"])
    result = row["result"]
    assert result["compiler_options"] == candidate.xla, name
    assert result["mu_dtype"] == candidate.mu_dtype, name
    assert all(result[k] == v for k, v in candidate.model.items()), name
    assert result["batch"] == 8 * candidate.batch_scale, name
  assert rows["B.default"]["verdict"] == "baseline"
  assert rows["L.parallel_no_bias"]["verdict"] == (
      "model differs (parallel_block, use_bias)")
  # FP8 against bf16 over the long run: the loss after its last step.
  assert rows["L.long_fp8"]["steps"] == 25
  assert "after 25 steps" in rows["L.long_fp8"]["verdict"]
  assert rows["B.default"]["result"]["profile"]["share_by_kind"]
  assert lines[-1] == f"(results and logs: {tmp_path})"


def test_a_process_that_dies_in_a_candidate_is_followed_by_another(tmp_path):
  """A hard crash (here: the first candidate's log says it started, as a
  dead process leaves it) costs that candidate alone."""
  names = [c.name for c in sweep.candidates(dry=True)]
  for name in names[1:]:  # All done but the first, which "died".
    (tmp_path / f"{name}.log").write_text("not run: test\n")
  (tmp_path / f"{names[0]}.log").write_text("started\n")
  env = processes.command_env(PYTHON=sys.executable, OUT=str(tmp_path))
  done = subprocess.run(
      [os.path.join(REPO, "benchmarks", "gpu_sweep.sh"), "--dry"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = json.loads((tmp_path / "sweep.json").read_text())
  assert rows[names[0]] == {"failed": "failed: started"}
  assert rows[names[1]] == {"failed": "failed: not run: test"}


@pytest.mark.parametrize("candidate", sweep.candidates(), ids=lambda c: c.name)
def test_every_candidate_takes_its_options(candidate):
  """Every candidate (the dry run runs a few): its XLA options are this
  XLA's (a function compiles with them; a GPU's options are parsed on a
  CPU too) and its model options a valid config."""
  x = jnp.ones((4, 8), jnp.float32)
  compiled = jax.jit(lambda x: jnp.tanh(x @ x.T).sum()).lower(x).compile(
      candidate.xla or None)
  assert np.isfinite(float(compiled(x)))
  config = speed._config(
      "testing",
      32,
      {  # pylint: disable=protected-access
          "dtype": "bfloat16",
          **candidate.model
      },
      "supervised")
  assert all(config.model[k] == v for k, v in candidate.model.items())


def test_xla_options_reach_the_compiler():
  """An option XLA does not have fails the run's compilation: the options
  are given to it, not dropped on the way."""
  assert speed.xla_options("xla_gpu_enable_triton_gemm=false,"
                           "xla_gpu_cudnn_gemm_fusion_level=2,"
                           "xla_gpu_enable_command_buffer=") == {
                               "xla_gpu_enable_triton_gemm": False,
                               "xla_gpu_cudnn_gemm_fusion_level": 2,
                               "xla_gpu_enable_command_buffer": ""
                           }
  with pytest.raises(UserError, match="no option named"):
    speed.run("testing", batch=8, image_size=32, num_steps=1,
              compiler_options={"xla_no_such_option": True})
  with pytest.raises(UserError, match="NAME=VALUE"):
    speed.xla_options("triton=false")


def _result(name="B.x", **changes):
  result = {
      "variant": "ViT-B/16",
      "batch": 256,
      "images_per_sec": 1000.0,
      "mfu": 0.4,
      "compiled_memory": {
          "total_bytes": 20 * 2**30
      },
      "final_loss": 5.0,
      "losses": [6.0] * 19 + [5.0],
      "device": "NVIDIA H200",
      "jax_version": "0.11.2",
      "compiler_options": {},
      "mu_dtype": "float32",
      "attention": "auto",
      "remat": "none",
      "parallel_block": False,
      "use_bias": True,
      "qkv_bias": True,
      "qk_norm": False,
      "gelu_approximate": True,
      "fp8": False,
      "sweep": {
          "name": name
      }
  }
  return {**result, **changes}


@pytest.mark.parametrize("changes, verdict", [
    (dict(images_per_sec=1100.0), "faster, same loss"),
    (dict(images_per_sec=1100.0,
          losses=[6.0] * 19 + [5.2]), "faster, other loss"),
    (dict(images_per_sec=1005.0), "not faster"),
    (dict(images_per_sec=1200.0,
          parallel_block=True), "model differs (parallel_block)"),
    (dict(images_per_sec=1200.0, batch=512), "another batch"),
    (dict(images_per_sec=1200.0, losses=[6.0] * 30), "faster, another length"),
])
def test_each_run_is_judged_against_its_baseline(changes, verdict):
  row = sweep_table.compare(_result(**changes), _result())
  assert row["verdict"] == verdict
  assert row["speed_ratio"] == pytest.approx(changes["images_per_sec"] / 1000)


def test_a_long_run_compares_its_last_loss_too():
  long = lambda loss, **c: _result(losses=[6.0] * 199 + [loss], final_loss=loss,
                                   **c)
  row = sweep_table.compare(long(0.52, fp8=True), long(0.5))
  assert row["loss_at_20"] == 6.0 and row["same_final_loss"] is False
  assert row["verdict"] == ("model differs (fp8); after 200 steps 0.520 "
                            "against 0.500")


def _write(folder, runs: dict):
  for name, result in runs.items():
    (folder / f"{name}.json").write_text(json.dumps(result))


def test_the_winners_combine_and_must_beat_both_runs_of_the_default(tmp_path):
  triton = {"xla_gpu_enable_triton_gemm": False}
  hiding = {"xla_gpu_enable_latency_hiding_scheduler": True}
  _write(
      tmp_path, {
          "B.default": _result(),
          "B.default_again": _result(images_per_sec=1005.0),
          "B.no_triton": _result(images_per_sec=1100.0,
                                 compiler_options=triton),
          "B.lhs": _result(images_per_sec=1050.0, compiler_options=hiding),
          "B.mu_bf16": _result(images_per_sec=1020.0, mu_dtype="bfloat16"),
          "B.slow": _result(images_per_sec=900.0, attention="xla"),
          "B.xla": _result(images_per_sec=1030.0, attention="xla"),
      })
  settings = ["B.no_triton", "B.lhs", "B.mu_bf16", "B.slow", "B.xla"]
  assert sweep_table.winners(str(tmp_path), "B", settings) == {
      "xla": {
          **triton,
          **hiding
      },
      "model": {
          "attention": "xla"
      },
      "mu_dtype": "bfloat16"
  }
  # A second run of the default at 1,060 images/s: only 1.1x still wins.
  _write(tmp_path, {"B.default_again": _result(images_per_sec=1060.0)})
  assert sweep_table.winners(str(tmp_path), "B", settings) == {
      "xla": triton,
      "model": {},
      "mu_dtype": "float32"
  }
  _write(tmp_path, {"B.default_again": _result(images_per_sec=2000.0)})
  assert sweep_table.winners(str(tmp_path), "B", settings) == {}


def test_the_table_shows_each_failure_and_what_did_not_run(tmp_path):
  _write(tmp_path, {"B.default": _result("B.default"), "B.x": _result()})
  (tmp_path / "B.broken.log").write_text("started\nOOM: out of memory\n")
  text = sweep_table.table(str(tmp_path),
                           ["B.default", "B.x", "B.broken", "B.later"])
  lines = text.splitlines()
  assert lines[0] == "gpu_sweep: device NVIDIA H200, jax 0.11.2"
  assert lines[2].split()[-1] == "baseline"
  assert lines[3].endswith("not faster")  # Its own speed: 1.000x.
  assert lines[4].split() == [
      "B", "B.broken", "failed:", "OOM:", "out", "of", "memory"
  ]
  assert lines[5].split() == [
      "B", "B.later", "not", "run:", "the", "budget", "ran", "out"
  ]
