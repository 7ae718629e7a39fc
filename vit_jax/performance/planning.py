"""Plan before you pay: compile the train step for a target, report memory.

The library of the `plan` command (`vit_jax/commands/plan.py`); training's
own check before its first step is `vit_jax/loop/preflight.py`.
`plan(config, topology)` builds exactly what `trainer.train_and_evaluate`
builds (model, optimizer, sharding rules, mesh, gradient accumulation,
remat, scan, dtypes) from abstract arrays only (nothing is allocated),
compiles the train step for the target
and reports its per-device memory from XLA's `memory_analysis()`, whether
it fits, what a step moves between devices against the least its sharding
must (`communication.py`) and where its time goes (`roofline.py`). The
target is any TPU topology libtpu describes, such as `v3:4x4`, `v5e:4x4`,
`v5p:2x2x4` or `tpu7x:2x2x1` (compiled here by libtpu, from the `tpu`
extra; no TPU needed; `targets.py`), or `cpu:N` (N host devices). A step
the TPU compiler refuses for want of memory is reported as not fitting
(as unknown where a v4 core's memory refused what its megacore chip may
hold), with the compiler's lower bound of its need.
"""

import math
import re
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import hardware
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax.config import imports
from vit_jax.data import handover
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import preflight
from vit_jax.performance import communication
from vit_jax.performance import flops
from vit_jax.performance import roofline
from vit_jax.performance import targets
from vit_jax.training import fsdp
from vit_jax.training import optim
from vit_jax.training import train_state

# Share of device memory the compiled step may use; the rest is left to the
# runtime (program code, collectives' buffers) and fragmentation.
FIT_FRACTION = 0.9


def _num_classes(config: ml_collections.ConfigDict) -> int:
  """From the dataset's metadata, without reading or preparing the data."""
  if config.dataset == "digits":
    return 10
  try:
    tfds = imports.import_quietly("tensorflow_datasets")
    features = tfds.builder(config.dataset,
                            data_dir=config.data_dir).info.features
    label = features["label"] if "label" in features else features[
        "labels"].feature
    return label.num_classes
  except Exception as e:  # Folders, unknown or unavailable builders.
    raise UserError(f"Cannot read the number of classes of "
                    f"{config.dataset}; pass --num_classes.") from e


def plan(config: ml_collections.ConfigDict, topology: str,
         num_classes: Optional[int] = None, hbm_gib: Optional[float] = None, *,
         slices: int = 1, dcn_gbps: Optional[float] = None) -> dict:
  """Compiles the config's train step for `slices` x `topology` (joined by
  DCN, at `dcn_gbps` GB/s per chip if not the table's); returns the
  report."""
  checks.check_fields(config)
  if dcn_gbps is not None and not dcn_gbps > 0:
    raise UserError(f"--dcn_gbps={dcn_gbps}: give each chip's data-centre "
                    "network bandwidth in GB/s, a positive number.")
  devices, placed = targets.target(topology, slices)
  mesh = sharding.mesh_from_config(config, devices)
  checks.check_batches(config, mesh, process_count=placed.hosts)
  config = objectives.decide(config)
  objective = objectives.of(config)
  if objective.classifies or objective.carries(config).labels:
    num_classes = num_classes or _num_classes(config)
  model = objective.model(config, num_classes)
  num_steps = max(config.total_steps, 1)  # The schedule's length only.
  tx, schedule = optim.make_optimizer(config, num_steps)
  state, state_sharding = train_state.abstract_train_state(
      model, tx, config.image_size, mesh, config.sharding, ema=config.ema_decay
      > 0)
  optim.check_param_rules(config, state.params)
  # A distillation's teachers, as shapes on the target's mesh.
  teachers = objective.teachers(config, mesh, num_classes, abstract=True)
  train_step = objectives.train_step(config, model, tx, schedule, mesh,
                                     state_sharding, teachers)
  image_dtype = jnp.uint8 if handover.hands_over_uint8(config) else jnp.float32
  batch_spec = objectives.abstract_batch(config, mesh, num_classes, image_dtype)
  lowered = train_step.lower(state, batch_spec)
  try:
    with targets.compiling_for(devices):
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    # The TPU compiler refuses a program larger than the chip's memory;
    # that is an answer ("does not fit"), with its lower bound of the need.
    needed = compile_time_oom_bytes(str(e))
    if needed is None:
      raise
    memory = {**{k: None for k in MEMORY_KEYS}, "total_bytes": needed}
    result = report(memory, devices, placed, topology, mesh, model, config,
                    hbm_gib, state.params, slices)
    fits, why = False, ""
    if (devices[0].device_kind in targets.MEGACORE_ONLY and
        needed <= FIT_FRACTION * result["hbm_bytes_per_device"]):
      fits, why = None, ("unknown (libtpu compiled for one core's memory; "
                         "the megacore chip has twice that)")
    return {
        **result, "fits": fits,
        "fit_unknown_because": why,
        "compile_error": str(e).splitlines()[0][:300]
    }
  result = report(preflight.memory_bytes(compiled), devices, placed, topology,
                  mesh, model, config, hbm_gib, state.params, slices)
  gathered_in_blocks = fsdp.blocks_gather(model, state_sharding.params)
  moved = traffic(compiled.as_text(), mesh, config, state.params,
                  state_sharding.params, devices[0].device_kind,
                  placed.devices_per_chip, gathered_in_blocks,
                  slice_of(config, devices, mesh), dcn_gbps)
  return {**result, **moved}


def slice_of(config, devices, mesh) -> Optional[tuple[int, ...]]:
  """The slice of each device in the mesh's order; None on one slice."""
  groups = sharding.slice_groups(devices, config.mesh.slices)
  if len(groups) == 1:
    return None
  index = {d.id: i for i, group in enumerate(groups) for d in group}
  return tuple(index[d.id] for d in mesh.devices.flat)


def _tensor_parallel_activations(config, mesh) -> float:
  """The activations tensor parallelism must all-reduce, where the config
  splits the blocks over `model`."""
  if not any("tp" in strategy for _, strategy in config.sharding.params):
    return 0.0
  variant = models.get_variant(config.model.variant)
  tokens = (config.image_size // models.stride(config.model))**2 + (
      models.form_of(config.model).num_prefix_tokens)
  return communication.tensor_parallel_activations(
      config.batch_size // sharding.data_shards(mesh), tokens,
      variant.hidden_size, variant.num_layers, mesh.shape[sharding.MODEL_AXIS],
      jnp.dtype(config.model.dtype).itemsize, config.model.remat == "full")


def traffic(text: str, mesh, config, params, params_sharding, kind: str,
            per_chip: int, gathered_in_blocks: bool,
            device_slices: Optional[tuple[int, ...]] = None,
            dcn_gbps: Optional[float] = None) -> dict:
  """A compiled step's communication (counted, and the least its sharding
  must move; over DCN and ICI apart where `device_slices`, each mesh
  position's slice, names several) and its roofline time; FLOPs counted
  over what executes."""
  shape = {k: int(v) for k, v in mesh.shape.items()}
  moved = communication.totals(
      communication.collectives(text, shape, device_slices))
  dtype = jnp.dtype(config.model.dtype)
  least = communication.minimum(
      params, params_sharding, mesh, dtype, gathered_in_blocks,
      _tensor_parallel_activations(config, mesh),
      data_slices=len(set(device_slices))
      if device_slices and config.mesh.fsdp_over_slices else 1)
  peak, bandwidths = (hardware.peak_flops(
      kind, per_chip), hardware.bandwidths(kind, per_chip))
  dcn = (dcn_gbps * 1e9 / per_chip if dcn_gbps else hardware.dcn_bandwidth(
      kind, per_chip)) if device_slices else None
  rates = roofline.Rates(peak, *bandwidths, dcn) if peak and bandwidths else (
      roofline.Rates(1.0, 1.0, 1.0))  # Units only: FLOPs still count.
  time = roofline.step_time(text, shape, rates, device_slices)
  result = {
      "communication": {
          **moved,
          "minimum_bytes": least["bytes"],
          "minimum_by_kind": least["by_kind"],
          "minimum_ici_bytes": least["bytes"] - least["dcn_bytes"],
          "minimum_dcn_bytes": least["dcn_bytes"],
      },
      "flops_per_step": time["flops"] * math.prod(shape.values()),
      "time": time if peak and bandwidths else None,
      "no_time_because": hardware.missing_rates(kind),
      "dcn_bytes_per_s_per_device": dcn,
      "no_dcn_time_because": "",
  }
  if device_slices and dcn is None and result["time"]:
    result["no_dcn_time_because"] = hardware.missing_dcn(kind)
  return result


MEMORY_KEYS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
               "total_bytes")
# The two forms of libtpu's refusal, each with a lower bound of the need.
_OOM_NEED = re.compile(
    r"Ran out of memory.*?(?:Total hbm usage >= |required "
    r"for HLO temporaries \()([\d.]+)([KMGT])", re.DOTALL)


def compile_time_oom_bytes(message: str) -> Optional[int]:
  """The lower bound of the memory a refused TPU program needs, from XLA's
  "Ran out of memory in memory space hbm ... Total hbm usage >= 16.01G" or
  "Ran out of memory on HBM, ... HLO temporaries (31.09G) exceeds ..."."""
  match = _OOM_NEED.search(message)
  if not match:
    return None
  return int(
      float(match.group(1)) * 2**(10 * (1 + "KMGT".index(match.group(2)))))


def report(memory, devices, placed: hardware.Placement, topology, mesh, model,
           config, hbm_gib, params, slices: int = 1) -> dict:
  kind = devices[0].device_kind
  hbm = (int(hbm_gib * 2**30) if hbm_gib else hardware.hbm_bytes(
      kind, placed.devices_per_chip))
  data_shards = sharding.data_shards(mesh)
  model_flops = 6 * flops.forward_macs(model,
                                       config.image_size) * (config.batch_size)
  return {
      "topology": topology,
      "slices": slices,
      "device_kind": kind,
      "num_devices": len(devices),
      "chips": placed.chips,
      "cores_per_chip": placed.cores_per_chip,
      "devices_per_chip": placed.devices_per_chip,
      "hosts": placed.hosts,
      "placement": placed.describe(),
      "mesh": {
          k: int(v) for k, v in mesh.shape.items()
      },
      "variant": config.model.variant,
      "batch_size": config.batch_size,
      "data_shards": data_shards,
      "batch_per_device": config.batch_size // data_shards,
      "accum_steps": config.accum_steps,
      "image_size": config.image_size,
      "dtype": config.model.dtype,
      "remat": config.model.remat,
      "scan_layers": config.model.scan_layers,
      "sharding": [list(r) for r in config.sharding.params],
      "hbm_bytes_per_device": hbm,
      **memory,
      "fits": None if hbm is None else memory["total_bytes"] <= (FIT_FRACTION *
                                                                 hbm),
      "fit_fraction": FIT_FRACTION,
      "params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(params))),
      "flops_per_step": None,  # Set from the compiled program.
      "model_flops_per_step": float(model_flops),
      "communication": None,
      "time": None,
      "no_time_because": "",
  }


def _gib(b: float) -> str:
  return f"{b / 2**30:.2f} GiB"


def _size(b: float) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if b >= 0.1 * scale:
      return f"{b / scale:.2f} {unit}"
  return f"{b:.0f} B"


def _communication_line(r: dict) -> str:
  c = r["communication"]
  kinds = ", ".join(f"{k} {_size(v)}" for k, v in c["by_kind"].items() if v)
  axes = ", ".join(f"{k} {_size(v)}" for k, v in c["by_axes"].items())
  least = c["minimum_bytes"]
  ratio = f" ({c['bytes'] / least:.2f}x)" if least else ""
  line = (f"moves per device per step: {_size(c['bytes'])} ("
          f"{kinds or 'none'}; over {axes or 'no axis'}); the least for its "
          f"sharding: {_size(least)}{ratio}")
  if r.get("slices", 1) > 1:
    dcn = ", ".join(f"{k} {_size(v)}" for k, v in c["dcn_by_kind"].items() if v)
    line += (f"\nof which between slices (DCN): {_size(c['dcn_bytes'])} ("
             f"{dcn or 'none'}), the least {_size(c['minimum_dcn_bytes'])}; "
             f"within them (ICI): {_size(c['ici_bytes'])}, the least "
             f"{_size(c['minimum_ici_bytes'])}")
  return line


def _time_line(r: dict) -> str:
  t = r["time"]
  if t is None:
    return f"step time: not estimated ({r['no_time_because']})"
  ms = lambda s: f"{s * 1e3:.2f} ms"
  overlapped = ("" if t["overlapped_fraction"] is None else
                f", {t['overlapped_fraction']:.0%} of it overlapped")
  links, without = ms(t["interconnect_s"]), ""
  if r.get("slices", 1) > 1:
    if t["dcn_s"] is None:
      links += f" (ICI) + DCN not estimated ({r['no_dcn_time_because']})"
      without = " without DCN"
    else:
      per_chip = r["dcn_bytes_per_s_per_device"] * r["devices_per_chip"]
      links += (f" (ICI) + {ms(t['dcn_s'])} (DCN at {per_chip / 1e9:.2f} "
                "GB/s per chip)")
  return (f"step time (roofline): compute {ms(t['compute_s'])}, memory "
          f"{ms(t['memory_s'])}, interconnect {links}{overlapped}; bound by "
          f"{t['bound']}; estimated {ms(t['est_step_s'])}{without}")


def _target(r: dict) -> str:
  """The topology planned for: `v5e:4x4`, or `2 x v5e:4x4` for slices."""
  slices = r.get("slices", 1)
  return f"{slices} x {r['topology']}" if slices > 1 else r["topology"]


def _devices_line(r: dict, hbm: str) -> str:
  """E.g. 'on v3:4x4: 32 x TPU v3 (16.00 GiB each) on 16 chips x 2 cores,
  a device per core; 4 hosts; mesh {...}'."""
  placed = r["placement"]
  hosts = f"{r['hosts']} host{'s' if r['hosts'] > 1 else ''}"
  return (f"on {_target(r)}: {r['num_devices']} x {r['device_kind']} "
          f"({hbm} each){' on ' + placed if placed else ''}; {hosts}; "
          f"mesh {r['mesh']}")


def _batch_line(r: dict) -> str:
  per_device = r["batch_per_device"]
  line = (f"batch {r['batch_size']}: {r['batch_size'] // r['hosts']} per "
          f"host, {per_device} per device (over {r['data_shards']} data "
          "shards)")
  if r["accum_steps"] > 1:
    line += (f", {per_device // r['accum_steps']} per device and micro-batch "
             f"({r['accum_steps']} accumulation steps)")
  return line


def format_report(r: dict) -> str:
  fits = {
      None: r.get("fit_unknown_because") or "unknown (pass --hbm_gib)",
      True: "yes",
      False: "NO"
  }[r["fits"]]
  hbm = _gib(r["hbm_bytes_per_device"]) if r["hbm_bytes_per_device"] else "?"
  lines = [
      f"{r['variant']}, batch {r['batch_size']} at {r['image_size']} px, "
      f"{r['dtype']}, sharding {r['sharding']}, remat {r['remat']}, "
      f"scan {r['scan_layers']}",
      _devices_line(r, hbm),
      _batch_line(r),
  ]
  if r.get("compile_error"):
    return "\n".join(lines + [
        f"per device: at least {_gib(r['total_bytes'])}; the compiler "
        f"refused it: {r['compile_error']}",
        f"fits in {r['fit_fraction']:.0%} of device memory: {fits}",
    ])
  return "\n".join(lines + [
      f"per device: arguments {_gib(r['argument_bytes'])} + temporaries "
      f"{_gib(r['temp_bytes'])} + outputs {_gib(r['output_bytes'])} - "
      f"aliased {_gib(r['alias_bytes'])} = {_gib(r['total_bytes'])}",
      f"fits in {r['fit_fraction']:.0%} of device memory: {fits}",
      f"{r['params']:,} parameters; {r['flops_per_step'] / 1e12:.1f} TFLOP "
      f"per step compiled (matmuls, every device), "
      f"{r['model_flops_per_step'] / 1e12:.1f} TFLOP from 6 x forward MACs",
      _communication_line(r),
      _time_line(r),
  ])


def format_row(r: dict) -> str:
  """One Markdown table row: model, batch, topology, sharding, GiB, fits,
  GiB moved per device (x the least; on several slices, then the MiB of
  it over DCN), bound, estimated step."""
  fits = {None: "?", True: "yes", False: "no"}[r["fits"]]
  strategies = "/".join(sorted({s for _, s in r["sharding"]}))
  at_least = ">= " if r.get("compile_error") else ""
  c, t = r["communication"], r["time"]
  moved = "?" if c is None else (
      f"{c['bytes'] / 2**30:.2f} ({c['bytes'] / c['minimum_bytes']:.2f}x)"
      if c["minimum_bytes"] else f"{c['bytes'] / 2**30:.2f}")
  if c is not None and r.get("slices", 1) > 1:
    moved += f", DCN {c['dcn_bytes'] / 2**20:.2f} MiB"
  time = "? | ?" if t is None else (
      f"{t['bound']} | {t['est_step_s'] * 1e3:.0f} ms "
      f"({t['overlapped_fraction'] or 0:.0%} overlapped)")
  return (f"| {r['variant']} | {r['batch_size']} | {_target(r)} | "
          f"{strategies} | {at_least}{r['total_bytes'] / 2**30:.2f} | {fits} "
          f"| {moved} | {time} |")
