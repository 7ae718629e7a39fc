"""Training speed on synthetic data: images/s, step and compile time, memory,
MFU (`vit-jax benchmark` prints `run`'s result).

Needs only jax/flax/optax (no TensorFlow), so it runs on any accelerator
host. Model FLOPs count 6 x forward multiply-adds per image (forward +
backward), as the paper's compute figures do; MFU divides the achieved model
FLOP/s by the device's peak (known accelerators, or `peak_tflops`).
"""

import resource
import statistics
import time

import jax
import numpy as np

from vit_jax import hardware
from vit_jax import inference
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax.config import defaults
from vit_jax.config import model_form
from vit_jax.errors import UserError
from vit_jax.loop import preflight
from vit_jax.performance import flops
from vit_jax.performance import profiling
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.training import train_state


def peak_flops(device, dtype: str, override_tflops):
  if override_tflops:
    return override_tflops * 1e12
  per_chip = hardware.placement(jax.devices()).devices_per_chip
  return hardware.peak_flops(device.device_kind,
                             per_chip) if dtype == "bfloat16" else None


def _synthetic_batch(batch: int, image_size: int, num_classes: int, mesh):
  """Random images and labels, fixed by seed 0, on the devices."""
  rng = np.random.default_rng(0)
  return sharding.to_global_batch(
      {
          "image": rng.uniform(
              -1, 1, (batch, image_size, image_size, 3)).astype(np.float32),
          "labels": np.eye(num_classes, dtype=np.float32)[rng.integers(
              0, num_classes, batch)],
          "mask": np.ones(batch, np.float32)  # As the input pipeline's.
      },
      mesh)


def _timed_steps(compiled, state, batch_data, num_steps: int, between=None):
  """(state, the loss after each timed step, seconds of each) after one
  warm-up step; `between()`, if given, runs after each (untimed here)."""
  state, metrics = compiled(state, batch_data)
  jax.block_until_ready(metrics)
  times, losses = [], []
  for _ in range(num_steps):
    start = time.perf_counter()
    state, metrics = compiled(state, batch_data)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    losses.append(float(metrics["loss"]))  # Outside the timed span.
    if between is not None:
      between()
  return state, losses, times


def _bytes_accessed(compiled):
  """HBM bytes XLA estimates one step reads and writes (None if unsaid)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # Older JAX: one per program.
    analysis = analysis[0] if analysis else None
  value = (analysis or {}).get("bytes accessed")
  return int(value) if value is not None else None


def xla_options(text: str) -> dict:
  """`NAME=VALUE,...` as the compiler options of one compiled step:
  true/false as booleans, integers as integers, the rest as strings."""
  options = {}
  for item in filter(None, text.split(",")):
    name, sep, value = item.partition("=")
    if not sep or not name.startswith("xla_"):
      raise UserError(f"--xla_options: {item!r} is not NAME=VALUE with an "
                      "XLA option's name (xla_...).")
    lowered = value.lower()
    if lowered in ("true", "false"):
      options[name] = lowered == "true"
    else:
      options[name] = int(value) if value.lstrip("-").isdigit() else value
  return options


def benchmarked_objectives() -> tuple[str, ...]:
  """The objectives a run may time on synthetic images (`Objective.
  benchmarked`): their steps differ in what they compute (MAE's encoder
  reads a quarter of the patches)."""
  return tuple(name for name, objective in objectives.OBJECTIVES.items()
               if objective.benchmarked)


def forward_macs(model, config, image_size: int) -> int:
  """An image's forward multiply-adds as the objective runs the model (MAE:
  the encoder on its visible patches, then the decoder)."""
  return flops.forward_macs(
      model, image_size,
      **objectives.of(config).forward_options(config, image_size))


def _config(variant: str, image_size: int, model_options, objective: str,
            mae_options=None):
  """The decided config of a run: the variant at `image_size`, GELU tanh as
  released, `model_options` on top."""
  config = defaults.get_config()
  config.model.update({
      "variant": variant,
      "gelu_approximate": True,
      **(model_options or {})
  })
  config.update({"objective": objective, "image_size": image_size})
  config.mae.update(mae_options or {})
  config = objectives.decide(config)  # No weights: as at random init.
  models.variants.check_image_size(variant, image_size, "--image_size")
  objectives.check_config(config)
  return config


def _compile(jitted, args, compiler_options):
  """`jitted` compiled for `args`, with XLA's `compiler_options` on top of
  the backend's defaults (`hardware.compiler_options`)."""
  try:
    return jitted.lower(*args).compile(
        compiler_options=compiler_options or None)
  except jax.errors.JaxRuntimeError as error:
    if "No such compile option" not in str(error):
      raise
    raise UserError(f"This XLA has no option named in {compiler_options}: "
                    f"{error}") from None


def _prepare(variant, batch, image_size, num_classes, model_options, mu_dtype,
             compiler_options, objective, mae_options, num_steps):
  """(config, model, compiled train step, its first state, the synthetic
  batch, compile seconds)."""
  config = _config(variant, image_size, model_options, objective, mae_options)
  model = objectives.of(config).model(config, num_classes)
  config.update(dict(optimizer="adam", warmup_steps=1, mu_dtype=mu_dtype))
  mesh = sharding.make_mesh()
  sharding.local_batch_size(batch, mesh, what="batch")
  tx, schedule = optim.make_optimizer(config, num_steps + 1)
  state, state_sharding = train_state.create_train_state(
      model, tx, image_size, 0, mesh)
  train_step = steps.jit_train_step(
      steps.make_train_step(model, tx,
                            objectives.of(config).loss(config, mesh), schedule,
                            mesh), state_sharding, mesh)
  batch_data = _synthetic_batch(batch, image_size, num_classes, mesh)
  start = time.perf_counter()
  compiled = _compile(train_step, (state, batch_data), compiler_options)
  return (config, model, compiled, state, batch_data,
          time.perf_counter() - start)


def step_timer(variant: str, batch: int, image_size: int, model_options=None,
               forward_only: bool = False, num_classes: int = 1000):
  """A function that runs one more train step (or, with `forward_only`, one
  more forward of `run_inference`'s) of this run and returns its seconds:
  a reference to time in alternation with another run's steps (`run`'s
  `between`), so that both see the same state of a noisy machine."""
  if forward_only:
    _, _, apply, args, _ = _prepare_inference(variant, batch, image_size,
                                              num_classes, model_options, None)
    jax.block_until_ready(apply(*args))

    def forward() -> float:
      start = time.perf_counter()
      jax.block_until_ready(apply(*args))
      return time.perf_counter() - start

    return forward
  *_, compiled, state, batch_data, _ = _prepare(
      variant, batch, image_size, num_classes, model_options, "float32", None,
      "supervised", None, 1_000_000)
  box = [compiled(state, batch_data)[0]]

  def step() -> float:
    start = time.perf_counter()
    box[0], metrics = compiled(box[0], batch_data)
    jax.block_until_ready(metrics)
    return time.perf_counter() - start

  return step


def run(variant: str, batch: int, image_size: int, num_classes: int = 1000,
        num_steps: int = 10, model_options=None, mu_dtype: str = "float32",
        peak_tflops=None, profile_steps: int = 0, compiler_options=None,
        objective: str = "supervised", mae_options=None, between=None) -> dict:
  """`model_options`: config.model fields beside the variant (dtype, remat,
  attention, fp8, ViT-22B's block options...); GELU tanh as released.
  `compiler_options`: XLA options of this step's compilation alone (e.g.
  {"xla_gpu_enable_triton_gemm": False}), so one process compares many.
  `objective`: one of `benchmarked_objectives()`, with its defaults;
  `mae_options`: fields of config.mae (the mask ratio, the decoder's
  sizes). `between()` runs after each timed step (a reference's,
  `step_timer`)."""
  config, model, compiled, state, batch_data, compile_s = _prepare(
      variant, batch, image_size, num_classes, model_options, mu_dtype,
      compiler_options, objective, mae_options, num_steps)
  state, losses, times = _timed_steps(compiled, state, batch_data, num_steps,
                                      between)
  profile = (profiling.device_time_by_op(lambda s: compiled(s, batch_data),
                                         state, profile_steps)
             if profile_steps else None)
  step_s = statistics.median(times)
  images_per_sec = batch / step_s
  macs = forward_macs(model, config, image_size)
  device = jax.devices()[0]
  peak = peak_flops(device, config.model.dtype, peak_tflops)
  model_flops_per_sec = images_per_sec * 6 * macs
  memory = device.memory_stats() or {}
  spec = models.get_variant(variant)
  return {
      "variant": variant,
      "mode": "train",
      # The architecture, so another code base can build the same model
      # (benchmarks/timm_speed.py).
      "hidden_size": spec.hidden_size,
      "mlp_dim": spec.mlp_dim,
      "num_heads": spec.num_heads,
      "num_layers": spec.num_layers,
      "patch_size": spec.patch_size,
      "hybrid": spec.resnet is not None,
      "num_classes": num_classes,
      "objective": objective,
      # Its own section of the config (config.mae, ...), if it has one.
      "objective_config": objectives.of(config).config_section_of(config),
      "parameters": sum(x.size for x in jax.tree.leaves(state.params)),
      "batch": batch,
      "image_size": image_size,
      # The model's options (fp8: MFU stays relative to the dtype's peak).
      **{
          k: config.model[k] for k in model_form.benchmark_fields()
      },
      "mu_dtype": mu_dtype,
      "compiler_options": compiler_options or {},
      "device": device.device_kind,
      "num_devices": jax.device_count(),
      "jax_version": jax.__version__,
      "compile_s": compile_s,
      "step_s": step_s,
      "images_per_sec": images_per_sec,
      "images_per_sec_per_device": images_per_sec / jax.device_count(),
      "forward_gmacs_per_image": macs / 1e9,
      "model_tflops_per_sec": model_flops_per_sec / 1e12,
      "peak_tflops_per_device": peak / 1e12 if peak else None,
      "mfu": (
          model_flops_per_sec / (peak * jax.device_count()) if peak else None),
      "peak_device_memory_gib": (
          memory["peak_bytes_in_use"] /
          2**30 if "peak_bytes_in_use" in memory else None),
      # XLA's own accounts of the step, the same on any run of it: its
      # per-device memory and the bytes it reads and writes.
      "compiled_memory": preflight.memory_bytes(compiled),
      "bytes_accessed": _bytes_accessed(compiled),
      "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss /
                           2**20,
      "final_loss": losses[-1],
      # After each timed step (the sweep compares the 20th; FP8 the 200th).
      "losses": losses,
      "profile": profile,
  }


def _prepare_inference(variant, batch, image_size, num_classes, model_options,
                       compiler_options):
  """(config, model, compiled forward, its arguments, compile seconds)."""
  config = _config(variant, image_size, model_options, "supervised")
  model = objectives.of(config).model(config, num_classes)
  mesh = sharding.make_mesh(devices=jax.local_devices())
  sharding.local_batch_size(batch, mesh, what="batch")
  params, params_sharding = sharding.random_params(model, image_size, 0, mesh)
  # A random head (at init it is zeros: every logit 0, nothing to compare).
  head = params["head"]["kernel"]
  params["head"]["kernel"] = jax.device_put(
      0.02 * jax.random.normal(jax.random.key(1), head.shape, head.dtype),
      head.sharding)
  loaded = inference.Loaded("random", config, model, params, mesh,
                            params_sharding, trained_here=False)
  apply = inference.make_apply_fn(loaded, lambda outputs, images: outputs[0])
  images = _synthetic_batch(batch, image_size, num_classes, mesh)["image"]
  start = time.perf_counter()
  compiled = _compile(apply, (params, images), compiler_options)
  return (config, model, compiled, (params, images),
          time.perf_counter() - start)


def run_inference(variant: str, batch: int, image_size: int,
                  num_classes: int = 1000, num_steps: int = 10,
                  model_options=None, compiler_options=None,
                  between=None) -> dict:
  """`predict`'s jitted forward (`inference.make_apply_fn`: the logits of
  a batch of images, split over this process's devices) on random weights
  and images (seed 0): images/s of the median of `num_steps` calls after a
  warm-up one (`between()` after each), and the logits (`logits`, to
  compare runs)."""
  config, model, compiled, args, compile_s = _prepare_inference(
      variant, batch, image_size, num_classes, model_options, compiler_options)
  logits = jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(num_steps):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
    if between is not None:
      between()
  step_s = statistics.median(times)
  return {
      "variant": variant,
      "mode": "inference",
      "batch": batch,
      "image_size": image_size,
      **{
          k: config.model[k] for k in model_form.benchmark_fields()
      },
      "compiler_options": compiler_options or {},
      "device": jax.devices()[0].device_kind,
      "num_devices": jax.local_device_count(),
      "jax_version": jax.__version__,
      "compile_s": compile_s,
      "step_s": step_s,
      "images_per_sec": batch / step_s,
      "forward_gmacs_per_image": flops.forward_macs(model, image_size) / 1e9,
      "logits": np.asarray(jax.device_get(logits)),
  }
