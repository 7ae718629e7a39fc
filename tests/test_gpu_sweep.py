"""benchmarks/gpu_sweep.sh: its dry mode on CPU runs every candidate's
flags (XLA's options too), and its table judges each run against the
default of the same sitting."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "sweep_table", os.path.join(REPO, "benchmarks", "sweep_table.py"))
sweep_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep_table)


def test_dry_sweep_runs_every_candidate_into_one_table(tmp_path):
  env = processes.command_env(PYTHON=sys.executable, OUT=str(tmp_path))
  done = subprocess.run(
      [os.path.join(REPO, "benchmarks", "gpu_sweep.sh"), "--dry"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert lines[0].startswith("gpu_sweep: device cpu, jax "), lines
  assert lines[1].split()[:4] == ["model", "run", "batch", "images/s"]
  assert not [line for line in lines if "failed" in line], done.stdout
  rows = json.loads((tmp_path / "sweep.json").read_text())
  # Every flag the sweep passes ran: the XLA options (which XLA would
  # refuse, unknown), the optimizer's, the model's.
  for name in ("B.no_triton_gemm", "B.cudnn_gemm_fusion", "B.latency_hiding",
               "B.cudnn_layer_norm", "B.exhaustive_tiling", "B.no_cuda_graphs",
               "B.mu_bf16", "B.parallel_block", "B.no_bias", "B.qk_norm",
               "B.gelu_erf", "B.remat_dots", "B.batch_2x", "L.parallel_no_bias",
               "L.fp8"):
    assert "result" in rows[name], (name, rows[name])
  assert rows["B.default"]["verdict"] == "default"
  assert rows["B.mu_bf16"]["result"]["mu_dtype"] == "bfloat16"
  assert "--xla_gpu_enable_triton_gemm=false" in (
      rows["B.no_triton_gemm"]["result"]["xla_flags"])
  assert rows["B.parallel_no_bias" if "B.parallel_no_bias" in
              rows else "L.parallel_no_bias"]["verdict"].startswith(
                  "model differs (parallel_block, use_bias)")
  # FP8 against bf16 over the long run: the loss after its last step.
  assert rows["L.fp8"]["steps"] == 25 and "after 25 steps" in (
      rows["L.fp8"]["verdict"])
  assert rows["B.default"]["result"]["profile"]["share_by_kind"]
  assert lines[-1] == f"(results and logs: {tmp_path})"


def _result(**changes):
  result = {
      "variant": "ViT-B/16",
      "batch": 256,
      "images_per_sec": 1000.0,
      "mfu": 0.4,
      "peak_device_memory_gib": 20.0,
      "final_loss": 5.0,
      "losses": [6.0] * 19 + [5.0],
      "device": "NVIDIA H200",
      "jax_version": "0.11.2",
      "xla_flags": "",
      "mu_dtype": "float32",
      "attention": "auto",
      "remat": "none",
      "parallel_block": False,
      "use_bias": True,
      "qkv_bias": True,
      "qk_norm": False,
      "gelu_approximate": True,
      "fp8": False
  }
  return {**result, **changes}


@pytest.mark.parametrize("changes, verdict", [
    ({
        "images_per_sec": 1100.0
    }, "faster, same loss"),
    ({
        "images_per_sec": 1100.0,
        "losses": [6.0] * 19 + [5.2]
    }, "faster, other loss"),
    ({
        "images_per_sec": 1005.0
    }, "not faster"),
    ({
        "images_per_sec": 1200.0,
        "parallel_block": True
    }, "model differs (parallel_block)"),
    ({
        "images_per_sec": 1200.0,
        "batch": 512
    }, "faster at another batch"),
])
def test_each_run_is_judged_against_the_default(changes, verdict):
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


def test_the_winners_flags_combine_and_failures_show_their_log(tmp_path):
  runs = {
      "B.default": _result(),
      "B.no_triton": _result(images_per_sec=1100.0,
                             xla_flags="--xla_gpu_enable_triton_gemm=false"),
      "B.lhs": _result(
          images_per_sec=1050.0,
          xla_flags="--xla_gpu_enable_latency_hiding_scheduler=true"),
      "B.mu_bf16": _result(images_per_sec=1020.0, mu_dtype="bfloat16"),
      "B.slow": _result(images_per_sec=900.0, attention="xla"),
  }
  for name, result in runs.items():
    (tmp_path / f"{name}.json").write_text(json.dumps(result))
  (tmp_path / "B.broken.log").write_text("Traceback\nOOM: out of memory\n")
  assert sweep_table.winners(
      str(tmp_path), "B",
      list(runs)[1:]).split("\n") == [
          "--mu_dtype=bfloat16",
          "--xla_flags=--xla_gpu_enable_triton_gemm=false "
          "--xla_gpu_enable_latency_hiding_scheduler=true"
      ]
  text = sweep_table.table(str(tmp_path), list(runs) + ["B.broken"])
  assert text.splitlines()[0] == "gpu_sweep: device NVIDIA H200, jax 0.11.2"
  assert text.splitlines()[-1].split() == [
      "B", "broken", "failed:", "OOM:", "out", "of", "memory"
  ]


def test_a_setting_must_beat_both_runs_of_the_default(tmp_path):
  runs = {
      "B.default": _result(),
      "B.default_again": _result(images_per_sec=1060.0),
      "B.no_triton": _result(images_per_sec=1100.0,
                             xla_flags="--xla_gpu_enable_triton_gemm=false"),
      "B.lhs": _result(
          images_per_sec=1050.0,
          xla_flags="--xla_gpu_enable_latency_hiding_scheduler=true"),
  }
  for name, result in runs.items():
    (tmp_path / f"{name}.json").write_text(json.dumps(result))
  assert sweep_table.winners(
      str(tmp_path), "B",
      ["B.no_triton", "B.lhs"
      ]) == ("--xla_flags=--xla_gpu_enable_triton_gemm=false")
  sweep_table.table(str(tmp_path), list(runs))
  rows = json.loads((tmp_path / "sweep.json").read_text())
  assert rows["B.default_again"]["verdict"] == "default"
  assert rows["B.lhs"]["speed_ratio"] == pytest.approx(1050 / 1060)
