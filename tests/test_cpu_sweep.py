"""benchmarks/cpu_sweep.sh: its dry mode runs each kind of run (training,
inference, XLA's options, our own, another batch, XLA's own defaults, the
winners together) beside timm's, into one table; every setting it sweeps
is an option this XLA compiles with; and the CPU defaults reach every
jitted step but yield to XLA_FLAGS."""

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
from tests.helpers import torch_env
from vit_jax import hardware
from vit_jax import models
from vit_jax import sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(name: str):
  """A script of benchmarks/ as a module."""
  path = os.path.join(REPO, "benchmarks")
  sys.path.insert(0, path)  # Its siblings import each other.
  spec = importlib.util.spec_from_file_location(name, f"{path}/{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


cpu_sweep, timm_cpu = _module("cpu_sweep"), _module("timm_cpu")


def test_dry_sweep_runs_each_kind_of_run_beside_timm(tmp_path):
  torch_python = torch_env.require()
  env = processes.command_env(PYTHON=sys.executable, OUT=str(tmp_path),
                              BUDGET="3000", TORCH_PYTHON=torch_python)
  done = subprocess.run(
      [os.path.join(REPO, "benchmarks", "cpu_sweep.sh"), "--dry"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert lines[0].startswith("cpu_sweep: device cpu, jax "), lines
  assert "torch" in lines[0] and "timm" in lines[0]
  assert lines[1].split()[:5] == ["case", "run", "batch", "images/s", "x"]
  rows = json.loads((tmp_path / "sweep.json").read_text())
  names = [c.name for c in cpu_sweep.candidates(dry=True)]
  assert names == [n for n in cpu_sweep.DRY]
  cases = ["Ti", "S-b1"]  # Training and inference, beside timm's.
  assert list(rows) == names + [f"{c}.timm" for c in cases]
  failed = {n: r["failed"] for n, r in rows.items() if "failed" in r}
  # `best` runs only where a setting won (by chance, on a tiny model).
  assert set(failed) <= {"Ti.best", "S-b1.best"}, failed
  for name in set(names) - set(failed):
    row, candidate = rows[name], next(
        c for c in cpu_sweep.candidates(True) if c.name == name)
    result = row["result"]
    assert result["sweep"]["xla"] == candidate.xla or candidate.best, name
    assert all(result[k] == v for k, v in candidate.model.items()), name
    assert row["speed_ratio"] > 0, name
    if result["mode"] == "train":  # The loss after each of its steps.
      assert len(result["losses"]) == 3 and np.isfinite(row["loss_at_20"])
    else:  # Float32 sums in another order: within the tolerance.
      assert row["max_logit_difference"] < 1e-4, name
  assert rows["Ti.default"]["verdict"] == "baseline"
  assert rows["Ti.batch_16"]["verdict"] == "another batch"
  assert rows["Ti.batch_16"]["result"]["batch"] == 4
  assert rows["Ti.xla_default"]["result"]["sweep"]["defaults"] == {}
  assert rows["S-b1.default"]["result"]["batch"] == 1
  for case in cases:  # timm's run of the case, eager, as ours.
    theirs = rows[f"{case}.timm"]
    assert theirs["variant"] == "testing" and theirs["image_size"] == 32
    assert theirs["mode"] == ("train" if case == "Ti" else "inference")
    assert rows[f"{case}.default"]["timm_ratio"] > 0
  assert lines[-1] == f"(results and logs: {tmp_path})"


@pytest.mark.parametrize("name", sorted(cpu_sweep.XLA_SETTINGS))
def test_every_setting_is_an_option_this_xla_compiles_with(name):
  """Each XLA setting the sweep tries (the dry run tries a few) compiles
  a ViT block's kinds of ops: a matmul, a reduction, an elementwise op."""
  x = jnp.ones((4, 8), jnp.float32)
  fn = lambda x: jax.nn.softmax(jnp.tanh(x @ x.T), axis=-1).sum()
  compiled = jax.jit(fn).lower(x).compile(cpu_sweep.XLA_SETTINGS[name])
  assert float(compiled(x)) == pytest.approx(4.0)


def test_timms_sizes_are_our_variants():
  """benchmarks/timm_cpu.py builds timm's model from sizes written there
  (its Python has no JAX): those of our variants."""
  for variant, (width, depth, heads, mlp, patch) in timm_cpu.SIZES.items():
    spec = models.get_variant(variant)
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.mlp_dim,
            spec.patch_size) == (width, depth, heads, mlp, patch), variant


def test_cpu_defaults_reach_every_step_yield_to_xla_flags_and_switch_off(
    monkeypatch):
  """Our CPU defaults are given to each function jitted on a mesh (an
  option XLA lacks fails its compilation); an option XLA_FLAGS names keeps
  the value there; VIT_JAX_XLA_DEFAULTS=0 turns them all off."""
  monkeypatch.delenv(hardware.DEFAULTS_VARIABLE, raising=False)
  monkeypatch.setattr(hardware, "CPU_COMPILER_OPTIONS",
                      {"xla_no_such_option": True})
  step = sharding.jit_on_mesh(lambda x: x + 1,
                              sharding.make_mesh(devices=jax.devices()[:1]), ())
  with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile"):
    step(jnp.ones(2))
  option = {"xla_cpu_enable_fast_min_max": True}
  monkeypatch.setattr(hardware, "CPU_COMPILER_OPTIONS", option)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  assert hardware.compiler_options() == option
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_min_max=false")
  assert "xla_cpu_enable_fast_min_max" not in hardware.compiler_options()
  monkeypatch.setenv(hardware.DEFAULTS_VARIABLE, "0")
  assert hardware.compiler_options() == {}
