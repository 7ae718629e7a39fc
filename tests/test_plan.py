"""`vit-jax plan`: the train step compiled for CPU devices and for TPU
topologies that are not attached (libtpu from the `tpu` extra), and the
pre-flight memory check inside training."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import pytest

from vit_jax import hardware
from vit_jax.errors import UserError
from vit_jax.loop import preflight
from vit_jax.loop import trainer
from vit_jax.models import variants
from vit_jax.performance import planning
from vit_jax.performance import targets
from vit_jax.training import fsdp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The `testing` variant at 16 px with 10 classes: embedding 4*4*3*16+16, class
# token 16, 17 position embeddings of 16, two blocks of 2224, final norm 32,
# head 16*10+10 (see test_variants.plain_vit_param_count).
TESTING_PARAMS_DIGITS = 784 + 16 + 17 * 16 + 2 * 2224 + 32 + 170


def _sum_check(r):
  assert r["total_bytes"] == (r["argument_bytes"] + r["output_bytes"] -
                              r["alias_bytes"] + r["temp_bytes"])


def test_cpu_plan_reports_memory_flops_and_fit(digits_config):
  r = planning.plan(digits_config, "cpu:8", hbm_gib=1.0)
  assert (r["topology"], r["num_devices"], r["mesh"]) == ("cpu:8", 8, {
      "data": 8,
      "model": 1
  })
  assert r["params"] == TESTING_PARAMS_DIGITS
  _sum_check(r)
  # Parameters and two Adam moments (fp32) at least, all replicated.
  assert r["argument_bytes"] >= 3 * 4 * r["params"]
  assert r["hbm_bytes_per_device"] == 2**30 and r["fits"] is True
  # The compiled count covers the model's matmuls (plus the optimizer and
  # elementwise work, minus nothing): within a small factor of 6 x MACs.
  assert 0.8 < r["flops_per_step"] / r["model_flops_per_step"] < 3
  assert r["time"] is None  # No rates known for a CPU.
  # Replicated: the gradients are all-reduced over `data`, about the least.
  moved = r["communication"]
  assert set(moved["by_axes"]) == {"data"} and moved["by_kind"]["all-reduce"]
  assert 0.99 < moved["bytes"] / moved["minimum_bytes"] < 1.1
  # Memory unknown:
  assert planning.plan(digits_config, "cpu:8")["fits"] is None


@pytest.mark.parametrize("teacher", [None, "digits.npz"])
def test_plan_compiles_what_training_runs(digits_config, tmp_path, monkeypatch,
                                          teacher):
  """The plan's figures are those of the step `train_and_evaluate` runs
  (a distillation's with its teacher: its parameters and forward pass)."""
  seen = []
  check_fit = preflight.check_fit
  monkeypatch.setattr(preflight, "check_fit",
                      lambda *a: seen.append(check_fit(*a)) or seen[-1])
  digits_config.total_steps = 1
  if teacher:
    digits_config.objective = "distill"
    digits_config.distill.teachers = (os.path.join(REPO, "configs", "teachers",
                                                   teacher),)
  trainer.train_and_evaluate(digits_config, str(tmp_path))
  planned = planning.plan(digits_config, "cpu:8")
  assert seen == [{k: planned[k] for k in seen[0]}]


def test_preflight_stops_a_step_that_cannot_fit(digits_config, tmp_path,
                                                monkeypatch):
  monkeypatch.setattr(preflight, "device_memory_limit", lambda device: 1024)
  with pytest.raises(
      UserError, match=r"needs .* GiB per device .* but a "
      r"device has 0.00 GiB"):
    trainer.train_and_evaluate(digits_config, str(tmp_path))
  assert not (tmp_path / "checkpoints").exists() or not any(
      (tmp_path / "checkpoints").iterdir())


def _tpu_plan(config, strategy, topology="v5e:2x2"):
  config = config.copy_and_resolve_references()
  with config.unlocked():
    # Wide enough that TPU tiling (arrays pad to 8 x 128) does not hide the
    # sharding; one 32 px patch and scanned layers compile in seconds.
    config.model.variant = "ViT-B/32"
    config.model.scan_layers = True
    config.image_size = 32
    config.batch_size = 8
    config.sharding.params = ((".*", strategy),)
    config.sharding.fsdp_min_size = 0
  return planning.plan(config, topology)


@pytest.fixture(scope="module")
def fsdp_tpu_plan():
  """The FSDP plan of ViT-B/32 on a v5e-4 (both tests below read it)."""
  from configs import digits  # pylint: disable=g-import-not-at-top
  return _tpu_plan(digits.get_config("runlocal"), "fsdp")


_FSDP_TPU_PLAN = pytest.mark.xdist_group("fsdp_tpu_plan")  # Made once.


@_FSDP_TPU_PLAN
def test_tpu_topology_plan_without_a_tpu(digits_config, fsdp_tpu_plan):
  replicated = _tpu_plan(digits_config, "replicate")
  fsdp = fsdp_tpu_plan
  for r in (replicated, fsdp):
    assert (r["device_kind"], r["num_devices"]) == ("TPU v5 lite", 4)
    assert r["hbm_bytes_per_device"] == 16 * 2**30 and r["fits"] is True
    assert r["time"]["est_step_s"] > 0
    assert r["time"]["bound"] in ("compute", "memory", "interconnect")
    _sum_check(r)
  # Sharded over 4 devices, parameters and optimizer state take about a
  # quarter of the replicated arguments (the batch is split in both).
  assert fsdp["argument_bytes"] < 0.5 * replicated["argument_bytes"]


@_FSDP_TPU_PLAN
def test_fsdp_blocks_gather_their_weights_again_for_the_backward_pass(
    digits_config, fsdp_tpu_plan, monkeypatch):
  """Each encoder block gathers its FSDP-sharded weights where it runs, in
  the forward and again in the backward pass, instead of keeping all 12
  layers' gathered weights alive from one to the other."""
  regathered = fsdp_tpu_plan
  in_blocks = fsdp.gathering_plan

  def in_the_loss_only(model, shardings, **kwargs):  # All, before the blocks.
    return dataclasses.replace(in_blocks(model, shardings, **kwargs),
                               loss_gathers=shardings, block_gather=None)

  monkeypatch.setattr(fsdp, "gathering_plan", in_the_loss_only)
  kept = _tpu_plan(digits_config, "fsdp")
  # ViT-B/32 blocks: 7,087,872 parameters each, fp32 at this config's dtype.
  block_bytes = 7_087_872 * 4
  assert kept["temp_bytes"] - regathered["temp_bytes"] > 8 * block_bytes


# (devices, chips, cores per chip, devices per chip, hosts, device kind, GiB
# per device) of each generation's smallest slices, as libtpu describes them.
GENERATIONS = {
    "v2:2x2": (8, 4, 2, 2, 1, "TPU v2", 8),  # A core is a device.
    "v3:2x2": (8, 4, 2, 2, 1, "TPU v3", 16),  # A v3-8 host.
    "v4:2x2x2": (8, 8, 2, 1, 2, "TPU v4", 32),  # Megacore, as JAX runs v4.
    "tpu7x:2x2x1": (8, 4, 2, 2, 1, "TPU7x", 96),
    "v5p:2x2x1": (4, 4, 2, 1, 1, "TPU v5", 95),  # Megacore.
}


@pytest.mark.parametrize("topology", sorted(GENERATIONS))
def test_every_generation_plans_chips_cores_and_devices(digits_config,
                                                        topology):
  devices, chips, cores, per_chip, hosts, kind, gib = GENERATIONS[topology]
  r = planning.plan(digits_config, topology)
  assert (r["num_devices"], r["chips"], r["cores_per_chip"],
          r["devices_per_chip"], r["hosts"],
          r["device_kind"]) == (devices, chips, cores, per_chip, hosts, kind)
  assert r["hbm_bytes_per_device"] == gib * 2**30 and r["fits"] is True
  # The batch of 32 is split over every device, cores included.
  assert r["mesh"] == {"data": devices, "model": 1}
  assert r["batch_per_device"] == 32 // devices
  _sum_check(r)
  # Replicated: the gradients' all-reduce, about the least.
  moved = r["communication"]
  assert 0.99 < moved["bytes"] / moved["minimum_bytes"] < 1.1
  text = planning.format_report(r)
  how = "core" if per_chip == 2 else "chip (megacore)"
  assert (f"on {topology}: {devices} x {kind} ({gib:.2f} GiB each) on "
          f"{chips} chips x 2 cores, a device per {how}; {hosts} host") in text
  assert (f"batch 32: {32 // hosts} per host, {32 // devices} per device "
          f"(over {devices} data shards)") in text
  if kind in ("TPU v2", "TPU v3"):  # No public chip-to-chip bandwidth.
    assert r["time"] is None
    assert (f"step time: not estimated (Google publishes no chip-to-chip "
            f"bandwidth per chip for a {kind})") in text
  else:
    assert r["time"]["est_step_s"] > 0


def test_a_v3_8_host_trains_with_the_plans_mesh_and_batch(
    digits_config, tmp_path, capsys):
  """This process's 8 CPU devices stand for a v3-8 host's 8 cores: training
  splits the batch as the plan of v3:2x2 says."""
  planned = planning.plan(digits_config, "v3:2x2")
  digits_config.total_steps = 1
  trainer.train_and_evaluate(digits_config, str(tmp_path))
  said = capsys.readouterr().err
  assert (f"on 8 devices in 1 processes, mesh {planned['mesh']}, "
          f"{planned['batch_per_device']} images per device of each batch of "
          "32.") in said
  assert planned["mesh"] == {"data": 8, "model": 1}


def test_a_v3_32_slice_has_four_hosts_of_eight_cores():
  placed = hardware.placement(targets.target_devices("v3:4x4"))
  assert placed == hardware.Placement(devices=32, chips=16, cores_per_chip=2,
                                      devices_per_chip=2, hosts=4, tpu=True)
  assert placed.describe() == "16 chips x 2 cores, a device per core"
  assert hardware.placement(jax.devices()).describe() == ""  # CPU devices.


@pytest.mark.parametrize("topology, message", [
    ("v9x:4x4", "--topology='v9x:4x4': libtpu knows no TPU generation "
     "'v9x'; libtpu "),
    ("v3", "--topology='v3' is not GENERATION:AxB or GENERATION:AxBxC "
     "(chips along each axis), or cpu:N; libtpu "),
    ("v3:3x3", "--topology='v3:3x3': libtpu cannot describe it "
     "(INVALID_ARGUMENT: Topology layout"),
    ("", "--topology='' is not GENERATION:AxB or GENERATION:AxBxC "
     "(chips along each axis), or cpu:N; libtpu "),
])
def test_a_topology_libtpu_does_not_know_is_a_clear_error(
    digits_config, topology, message):
  with pytest.raises(UserError) as error:
    planning.plan(digits_config, topology)
  assert str(error.value).startswith(message)
  if "libtpu knows" in message or "cpu:N" in message:
    assert str(error.value).endswith(
        " knows v2, v3, v4, v5e, v5p, v6e, tpu7x (e.g. v3:4x4, v5e:4x4, "
        "v5p:2x2x4, tpu7x:2x2x1).")


def _cpu_count_error(count: str) -> str:
  return (f"error: --topology='cpu:{count}': cpu:N needs N, the number of "
          "host devices to plan for, to be a whole number of at least 1, e.g. "
          "cpu:8.")


def test_a_cpu_count_below_one_is_a_one_line_error():
  """The command's exit for one bad count; every kind of bad count gives
  the same error (checked without a process each)."""
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "plan",
      "--config=configs/digits.py:runlocal", "--topology=cpu:0"
  ], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [_cpu_count_error("0")]
  for count in ("-2", "two", "", "1.5"):
    with pytest.raises(UserError) as raised:
      targets.cpu_device_count(f"cpu:{count}")
    assert f"error: {raised.value}" == _cpu_count_error(count)
  assert targets.cpu_device_count("cpu:3") == 3


def test_plan_command_writes_json(tmp_path, tfds_data_dir):
  out = tmp_path / "plan.json"
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "plan",
      "--config=configs/digits.py:runlocal",
      f"--config.data_dir={tfds_data_dir}", "--topology=cpu:2", f"--out={out}"
  ], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "per device: arguments" in done.stdout
  report = json.loads(out.read_text())
  assert report["num_devices"] == 2 and report["variant"] == "testing"
  assert report["mesh"] == {"data": 2, "model": 1}
  assert jax.device_count() == 8  # The command's devices were its own.
  moved = report["communication"]
  assert planning.format_row(report) == (
      f"| testing | 32 | cpu:2 | replicate | "
      f"{report['total_bytes'] / 2**30:.2f} | ? | "
      f"{moved['bytes'] / 2**30:.2f} "
      f"({moved['bytes'] / moved['minimum_bytes']:.2f}x) | ? | ? |")
  assert "moves per device per step:" in done.stdout


@pytest.mark.parametrize(
    "kind, per_chip, gib, tflops",
    [
        ("TPU v5 lite", 1, 16, 197),  # v5e
        ("TPU v5", 1, 95,
         459),  # v5p: not taken for a v5e ("TPU v5" is shorter)
        ("TPU v6 lite", 1, 32, 918),
        ("TPU v4", 2, 16, 137.5),  # Two devices per chip share it.
        ("TPU v4", 1, 32, 275),  # Megacore: the chip is the device.
        ("TPU v3", 2, 16, 61.5),
        ("TPU v2", 2, 8, 22.5),
        ("TPU7x", 2, 96, 1153.5),
        ("NVIDIA H100 80GB HBM3", 1, 80, 989),
        ("NVIDIA A100-SXM4-80GB", 1, 80, 312),
        ("NVIDIA A100-SXM4-40GB", 1, 40, 312),
    ])
def test_chip_table_matches_reported_device_kinds(kind, per_chip, gib, tflops):
  assert hardware.hbm_bytes(kind, per_chip) == gib * 2**30
  assert hardware.peak_flops(kind, per_chip) == tflops * 1e12
  assert hardware.hbm_bytes("cpu") is None
  # Chips whose interconnect bandwidth per chip is not public: no estimate.
  if kind in ("TPU v2", "TPU v3"):
    assert hardware.bandwidths(kind, per_chip) is None
  else:
    assert hardware.bandwidths(kind, per_chip)[1] > 0


def test_a_program_the_tpu_compiler_refuses_does_not_fit():
  message = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile "
             "permanent error. Ran out of memory in memory space hbm. Used "
             "15.75G of 15.75G hbm. Exceeded hbm capacity by 7.86M.\n\n"
             "Total hbm usage >= 16.01G:\n")
  assert planning.compile_time_oom_bytes(message) == int(16.01 * 2**30)
  assert planning.compile_time_oom_bytes(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
      "required for HLO temporaries (31.09G) exceeds available HBM "
      "(15.75G).") == int(31.09 * 2**30)
  assert planning.compile_time_oom_bytes("INTERNAL: something else") is None


def test_plan_reports_a_step_too_big_for_the_chip(digits_config):
  """ViT-G/14 replicated on a v5e (1.8B parameters and two Adam moments do
  not fit in 16 GiB): an answer, not a crash. Tracing only; the compiler
  refuses it quickly."""
  with digits_config.unlocked():
    digits_config.model.variant = "ViT-G/14"
    digits_config.model.scan_layers = True
    digits_config.image_size = 28
    digits_config.batch_size = 4
  r = planning.plan(digits_config, "v5e:2x2")
  assert r["fits"] is False and r["total_bytes"] > 16 * 2**30
  assert "Ran out of memory" in r["compile_error"]
  assert "at least" in planning.format_report(r)
  # A v4 is planned as megacore chips of 32 GiB, but libtpu compiles for a
  # core's 16: a refusal under the chip's memory does not say it won't fit.
  with digits_config.unlocked():
    digits_config.model.variant = "ViT-g/14"  # 1.0B parameters.
    digits_config.batch_size = 8
  r = planning.plan(digits_config, "v4:2x2x2")
  assert 16 * 2**30 < r["total_bytes"] < 0.9 * 32 * 2**30
  assert r["fits"] is None and "Ran out of memory" in r["compile_error"]
  assert ("fits in 90% of device memory: unknown (libtpu compiled for one "
          "core's memory; the megacore chip has twice that)"
         ) in planning.format_report(r)


def test_plan_command_for_a_v3_host_twice_with_a_compilation_cache(tmp_path):
  """The command end to end on a v3-8 host; a second run with JAX's
  persistent cache (common on pods) is as quiet as the first."""
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
  for _ in range(2):
    done = subprocess.run([
        sys.executable, "-m", "vit_jax", "plan",
        "--config=configs/digits.py:runlocal", "--topology=v3:2x2"
    ], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Error reading persistent compilation cache" not in done.stderr
    assert ("on v3:2x2: 8 x TPU v3 (16.00 GiB each) on 4 chips x 2 cores, a "
            "device per core; 1 host; mesh {'data': 8, 'model': 1}\n"
            "batch 32: 32 per host, 4 per device (over 8 data shards)\n"
           ) in done.stdout


# One block 256 wide on a 16 px image of 8 px patches: compiles in seconds,
# and wide enough that the biases XLA sends whole over DCN (not each
# device's share) stay a few percent of the gradients.
variants.register(
    "testing, 256 wide",
    variants.Variant(hidden_size=256, mlp_dim=1024, num_heads=2, num_layers=1,
                     patch_size=8))


def _sliced_plan(config, topology, slices, **kwargs):
  """FSDP of the wide block on `slices` x `topology`, 2 images a device."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.model.variant = "testing, 256 wide"
    config.image_size = 16
    config.batch_size = config.eval_batch_size = 2 * slices * len(
        targets.target_devices(topology))
    config.sharding.params = ((".*", "fsdp"),)
    config.sharding.fsdp_min_size = 0
  return planning.plan(config, topology, slices=slices, **kwargs)


def _ici_by_kind(moved: dict) -> dict:
  return {k: v - moved["dcn_by_kind"][k] for k, v in moved["by_kind"].items()}


def test_two_slices_move_only_the_gradients_all_reduce_over_dcn(digits_config):
  """v5e:2x2 x 2 (FSDP inside each slice, as libtpu compiles a multi-slice
  program: one slice's devices, its DCN transfers sent to its runtime):
  between slices only the gradients' all-reduce, about the least (each
  device its FSDP shard); inside them the same as on one slice."""
  one, two = (_sliced_plan(digits_config, "v5e:2x2", s) for s in (1, 2))
  mesh = {"slice": 2, "data": 4, "model": 1}
  assert (two["slices"], two["num_devices"], two["chips"], two["hosts"],
          two["mesh"]) == (2, 8, 8, 2, mesh)
  moved, least = two["communication"], two["communication"]["minimum_dcn_bytes"]
  assert {k for k, v in moved["dcn_by_kind"].items() if v} == {"all-reduce"}
  assert least <= moved["dcn_bytes"] < 1.03 * least
  assert moved["by_axes"]["slice"] == moved["dcn_bytes"]
  # Inside a slice: what one slice moves (but for the metrics' scalars).
  for kind, sent in _ici_by_kind(one["communication"]).items():
    assert _ici_by_kind(moved)[kind] == pytest.approx(sent, rel=1e-2)
  assert moved["minimum_ici_bytes"] == one["communication"]["minimum_bytes"]
  # The roofline takes DCN at a v5e's 2 x 100 Gbps NICs for 8 chips.
  assert two["time"]["dcn_s"] == pytest.approx(moved["dcn_bytes"] / 3.125e9)
  text = planning.format_report(two)
  assert ("on 2 x v5e:2x2: 8 x TPU v5 lite (16.00 GiB each) on 8 chips x 1 "
          "core, a device per chip; 2 hosts; mesh {'slice': 2, 'data': 4, "
          "'model': 1}\nbatch 16: 8 per host, 2 per device (over 8 data "
          "shards)") in text
  assert "\nof which between slices (DCN): " in text
  assert "(DCN at 3.12 GB/s per chip)" in text
  assert (
      f"| 2 x v5e:2x2 | fsdp | {two['total_bytes'] / 2**30:.2f} | yes | "
      f"{moved['bytes'] / 2**30:.2f} ("
      f"{moved['bytes'] / moved['minimum_bytes']:.2f}x), DCN "
      f"{moved['dcn_bytes'] / 2**20:.2f} MiB | ") in planning.format_row(two)
  # One slice: no DCN, and the report as before.
  assert one["slices"] == 1 and one["communication"]["dcn_bytes"] == 0
  assert "DCN" not in planning.format_report(one)
  # Where the DCN rate is unknown, the rest is estimated without it.
  unknown = {
      **two, "time": {
          **two["time"], "dcn_s": None
      },
      "no_dcn_time_because": hardware.missing_dcn("TPU v4")
  }
  assert ("(ICI) + DCN not estimated (Google publishes no data-centre "
          "network bandwidth per chip or host for a TPU v4; pass --dcn_gbps)"
         ) in planning.format_report(unknown)
  assert planning.format_report(unknown).endswith(" without DCN")


def test_a_v5e_32_of_two_slices_all_reduces_each_shard_over_dcn(digits_config):
  two = _sliced_plan(digits_config, "v5e:4x4", 2)
  mesh = {"slice": 2, "data": 16, "model": 1}
  assert (two["num_devices"], two["hosts"], two["data_shards"],
          two["mesh"]) == (32, 8, 32, mesh)
  moved = two["communication"]
  assert {k for k, v in moved["dcn_by_kind"].items() if v} == {"all-reduce"}
  # The biases (a device's share: 16 floats) go whole: up to 10% more.
  least = moved["minimum_dcn_bytes"]
  assert least <= moved["dcn_bytes"] < 1.1 * least


def test_fsdp_over_slices_gathers_across_them_once(digits_config):
  """With `data` over both slices, libtpu gathers and reduce-scatters each
  weight across the slices, then inside them: DCN carries 1/7 of FSDP's
  bytes (1 of the 7 other devices' shares), at --dcn_gbps."""
  with digits_config.unlocked():
    digits_config.mesh.fsdp_over_slices = True
  r = _sliced_plan(digits_config, "v5e:2x2", 2, dcn_gbps=10.0)
  assert r["mesh"] == {"data": 8, "model": 1}
  moved = r["communication"]
  assert moved["dcn_by_kind"]["all-gather"] and moved["dcn_by_kind"][
      "reduce-scatter"]
  assert moved["dcn_bytes"] == pytest.approx(moved["minimum_dcn_bytes"],
                                             rel=0.01)
  assert r["time"]["dcn_s"] == pytest.approx(moved["dcn_bytes"] / 10e9)


def test_bad_slices_and_dcn_bandwidths_are_one_line_errors(digits_config):
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "plan",
      "--config=configs/digits.py:runlocal", "--topology=v5e:2x2", "--slices=0"
  ], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [
      "error: flag --slices=0: give the number of slices, a whole number of "
      "at least 1."
  ]
  for name, value, message in [
      ("slices", -1, "--slices=-1: give the number of slices of the "
       "topology, a whole number of at least 1."),
      ("dcn_gbps", 0.0, "--dcn_gbps=0.0: give each chip's data-centre "
       "network bandwidth in GB/s, a positive number."),
  ]:
    with pytest.raises(UserError) as raised:
      planning.plan(digits_config, "v5e:2x2", **{name: value})
    assert str(raised.value) == message
  cpu = r"^--slices=2 is for TPU topologies; for cpu:8, set --config.mesh"
  with pytest.raises(UserError, match=cpu):
    planning.plan(digits_config, "cpu:8", slices=2)
