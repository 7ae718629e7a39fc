"""The training loop: `train_and_evaluate(config, workdir)` (the `train`
command, `vit_jax/commands/train.py`, parses the flags and calls it).

config -> data (tf.data, per-process share) -> global sharded batch ->
jit(train_step, donated state) -> clu metric writers + periodic evaluation.
"""

import contextlib
import dataclasses
import datetime
import itertools
import math
import time
from typing import Callable
from typing import Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import console
from vit_jax import evaluators
from vit_jax import hardware
from vit_jax import objectives
from vit_jax import paths
from vit_jax import sharding
from vit_jax.config import imports
from vit_jax.data import input_pipeline
from vit_jax.data import length_schedule
from vit_jax.data import packing
from vit_jax.data import unreadable
from vit_jax.errors import NonFiniteLossError
from vit_jax.loop import checks
from vit_jax.loop import preflight
from vit_jax.training import checkpoint
from vit_jax.training import flexi
from vit_jax.training import optim
from vit_jax.training import teachers as teachers_lib
from vit_jax.training import train_state

# clu's writers load TensorFlow: loaded where the run starts, not when the
# config is checked.
metric_writers = imports.lazy("clu.metric_writers")
periodic_actions = imports.lazy("clu.periodic_actions")


def total_steps(config: ml_collections.ConfigDict, num_train_examples: int):
  if config.num_epochs is not None:
    return math.ceil(config.num_epochs * num_train_examples / config.batch_size)
  return config.total_steps


def warmup_steps(config: ml_collections.ConfigDict, num_train_examples: int):
  if config.warmup_epochs is not None:
    return math.ceil(
        config.warmup_epochs * num_train_examples / config.batch_size)
  return config.warmup_steps


class _Outputs:
  """The metric writer; for a remote workdir, TensorFlow's event files and
  profiles go to a local folder mirrored into the workdir on `sync()`."""

  def __init__(self, workdir):
    self.mirror = None
    if paths.is_remote(workdir) and jax.process_index() == 0:
      self.mirror = paths.LocalMirror(workdir)
    self.logdir = self.mirror.local if self.mirror else str(workdir)
    self.writer = metric_writers.create_default_writer(
        self.logdir, just_logging=jax.process_index() > 0)

  def sync(self):
    self.writer.flush()
    if self.mirror:
      self.mirror.sync()

  def close(self):
    self.writer.close()
    if self.mirror:
      self.mirror.close()


def _decided(config, workdir, resumed: bool):
  """The config decided (`objectives.decide`: a resumed run keeps its GELU
  form and tokenizer; a checkpoint to start from is read), before
  anything is written."""
  return objectives.decide(config, resumed_workdir=workdir if resumed else None)


def _record(config, workdir):
  """The decided config, written to WORKDIR/config.json, and what its
  objective keeps beside it (an image-text run's tokenizer file)."""
  # Every process has read the previous run's config.json before process 0
  # rewrites it (a process reading while it is written sees it truncated).
  multihost_utils.sync_global_devices("config.json read")
  if jax.process_index() == 0:
    (workdir / paths.CONFIG_FILE).write_text(
        config.to_json_best_effort(indent=2))
    objectives.of(config).keep(config, workdir)


def _starting_state(config, manager, model, tx, mesh):
  """(state, its shardings) to train from: a resumed run's latest
  checkpoint (`manager`'s, restored into the state's shapes: nothing is
  initialised), else config.init.checkpoint's weights, else random init."""
  abstract, state_sharding = train_state.abstract_train_state(
      model, tx, config.image_size, mesh, config.sharding, ema=config.ema_decay
      > 0)
  optim.check_param_rules(config, abstract.params)
  if manager is not None:
    restored = checkpoint.restore_latest(manager, abstract, state_sharding)
    if restored is not abstract:
      return restored, state_sharding
  state = train_state.initialise(model, tx, config.image_size, config.seed,
                                 state_sharding, ema=config.ema_decay > 0)
  if config.init.checkpoint:  # The objective's model's weights from it.
    params = objectives.of(config).init(config, config.init.checkpoint,
                                        state.params, state_sharding.params)
    state = state.replace(
        params=params,
        ema_params=(  # Own buffers: donated.
            None if state.ema_params is None else jax.tree.map(
                jnp.copy, params)))
  return state, state_sharding


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, float]:
  """Trains, evaluates periodically and at the end; returns final metrics.
  What it starts (the checkpoint manager, the writers, the input pipeline
  and their threads) is stopped when it returns or raises: not at
  interpreter exit, when their threads can no longer finish."""
  with contextlib.ExitStack() as started:
    return _train_and_evaluate(config, workdir, started)


def _close(manager):
  with contextlib.suppress(Exception):  # Said already, or an error is out.
    manager.wait_until_finished()
  manager.close()


def _manager(workdir, config, started: contextlib.ExitStack):
  manager = checkpoint.make_manager(workdir, config)
  started.callback(_close, manager)
  return manager


def _open_workdir(config, workdir, manager, teachers, resumed: bool,
                  started: contextlib.ExitStack):
  """(checkpoint manager, outputs), once every check has passed: nothing is
  written into the workdir before (a mistake leaves it as it was). A new
  run records its config and teachers there."""
  workdir = paths.make_workdir(workdir)
  if manager is None:
    manager = _manager(workdir, config, started)
  if teachers and not resumed:
    teachers_lib.check_recorded(workdir, teachers, resumed)
  _record(config, workdir)
  outputs = started.enter_context(contextlib.closing(_Outputs(workdir)))
  return manager, outputs


def _train_and_evaluate(config, workdir, started: contextlib.ExitStack):
  checks.check_fields(config)  # Before JAX starts its devices: at once.
  mesh = sharding.mesh_from_config(config)
  checks.check_batches(config, mesh)
  if paths.resolve(workdir).exists():  # A file in its place: said now.
    paths.make_workdir(workdir)
  resumed = checkpoint.has_saved_steps(workdir)
  config = _decided(config, workdir, resumed)
  # Only a resumed run's workdir is read before the checks have passed (its
  # checkpoints and teachers' record); nothing is written into it until then.
  manager = _manager(workdir, config, started) if resumed else None

  objective = objectives.of(config)
  data = objectives.training_data(config)
  found = unreadable.Collector(workdir)  # The streams' unreadable images.
  source = input_pipeline.make_source(data, index_dir=workdir)
  info = input_pipeline.get_info(data, source)
  checks.check_labels(config, info)
  checks.warn_if_loss_mismatches_labels(config, info)
  num_steps = total_steps(config, info.num_train_examples)
  model = objective.model(config, info.num_classes)
  tx, schedule = optim.make_optimizer(
      config, num_steps, warmup_steps(config, info.num_train_examples))
  # Frozen models its loss reads (a distillation's): loaded on every start.
  teachers = objective.teachers(config, mesh, info.num_classes)
  if teachers and resumed:  # Compared with those it started with.
    teachers_lib.check_recorded(paths.resolve(workdir), teachers, resumed)

  state, state_sharding = _starting_state(config, manager, model, tx, mesh)
  start_step = int(state.step)
  make_step = lambda m: objectives.train_step(config, m, tx, schedule, mesh,
                                              state_sharding, teachers)
  train_step = (flexi.FlexiTrainStep(config, model, make_step, start_step)
                if flexi.enabled(config) else make_step(model))
  evals = _evaluators(config, model, mesh, state_sharding.params, source, found,
                      teachers)
  batches = input_pipeline.make_train_iterator(
      data, source, start_step, labels=objective.carries(config).labels,
      collector=found)
  packed = packing.PackingStats()
  if packing.enabled(config):  # NaViT: several images per sequence.
    local = packing.sequences_per_batch(
        config, sharding.data_shards(mesh)) // jax.process_count()
    batches = _closing(
        packing.packed_batches(batches, config, local, jax.process_index(),
                               start_step, packed), batches)
  train_iter = started.enter_context(
      contextlib.closing(input_pipeline.prefetch_to_device(batches, mesh)))
  first_batch = next(train_iter)
  preflight.check_fit(train_step, state, first_batch)
  train_iter = itertools.chain([first_batch], train_iter)
  manager, outputs = _open_workdir(config, workdir, manager, teachers, resumed,
                                   started)

  learns = objective.describe(config, info.num_classes, teachers)
  placed = hardware.placement(jax.devices()).describe()
  console.say(
      "Training %s on %s from step %d to %d (%s) on %d devices%s in %d "
      "processes, mesh %s, %d images per device of each batch of %d.",
      config.model.variant, config.dataset, start_step, num_steps, learns,
      jax.device_count(), f" ({placed})" if placed else "", jax.process_count(),
      dict(mesh.shape), config.batch_size // sharding.data_shards(mesh),
      config.batch_size)
  preemption = checkpoint.Preemption()
  started.callback(preemption.restore)
  run = _Run(config, train_step, train_iter, evals, checkpoint.Saver(manager),
             outputs, preemption, start_step, num_steps,
             _UnreadableReport(found))
  result = _loop(run, state)
  run.saver.wait()  # A failed last save is said like any other.
  if packed.images:
    console.say("Packing: %s.", packed.describe())
  return result


class _closing:
  """Iterates `generator`; closing it closes `source` (its input
  pipeline) too."""

  def __init__(self, generator, source):
    self._generator, self._source = generator, source

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._generator)

  def close(self):
    self._generator.close()
    getattr(self._source, "close", lambda: None)()


def _evaluators(config, model, mesh, params_sharding, source, found,
                teachers=()) -> list[evaluators.Scheduled]:
  """config.evals' evaluators; under config.flexi, each at every evaluated
  patch size, named NAME_pSIZE."""
  if not flexi.enabled(config):
    return evaluators.from_config(config, model, mesh, params_sharding, source,
                                  unreadable=found, teachers=teachers)
  return [
      dataclasses.replace(scheduled, name=f"{scheduled.name}_p{size}")
      for size in flexi.eval_patch_sizes(config)
      for scheduled in evaluators.from_config(
          config, flexi.at_patch_size(model, size), mesh, params_sharding,
          source, unreadable=found, teachers=teachers)
  ]


@dataclasses.dataclass(frozen=True)
class _Run:
  """What the loop works with, made by `train_and_evaluate`."""
  config: ml_collections.ConfigDict
  train_step: Callable  # (state, batch) -> (state, metrics), jitted.
  batches: Iterator  # Global batches on the devices.
  evals: list[evaluators.Scheduled]
  saver: checkpoint.Saver
  outputs: "_Outputs"
  preemption: checkpoint.Preemption
  start_step: int
  num_steps: int
  report_unreadable: Callable[[], None]


class _DeferredLog:
  """The train metrics of a log step, written once the next step is
  dispatched (so the host never waits for the device), or at once before a
  save, an evaluation or the end."""

  def __init__(self, writer, timer):
    self.writer, self.timer = writer, timer
    self.held = None  # (step, metrics)
    self.result = {}  # The last written: train/loss (and accuracy).

  def hold(self, step: int, metrics):
    self.held = (step, metrics)

  def write(self):
    if self.held is not None:
      self.result.update(_log_train(self.writer, *self.held, self.timer))
      self.held = None


def _hooks(run: _Run) -> list[Callable[[int], None]]:
  """clu's progress report and the profile (process 0 only)."""
  if jax.process_index() > 0:
    return []
  hooks = [
      periodic_actions.ReportProgress(num_train_steps=run.num_steps,
                                      writer=run.outputs.writer)
  ]
  if run.config.profile_steps:
    hooks.append(
        periodic_actions.Profile(  # Once, for profile_steps steps.
            num_profile_steps=run.config.profile_steps,
            profile_duration_ms=None, first_profile=run.start_step + 10,
            every_secs=None, logdir=run.outputs.logdir))
  return hooks


def _loop(run: _Run, state) -> dict[str, float]:
  """Steps, logs, saves and evaluates. Metrics are fetched from the device
  only at log steps (one step late, so the host never waits) and before a
  save, so a diverged state is never written. Each evaluator runs when
  `due` and once at the last step."""
  config, last = run.config, run.num_steps
  log = _DeferredLog(run.outputs.writer,
                     _Timer(run.start_step, last, _images_at(config)))
  hooks = _hooks(run)
  evaluated = {}
  for step in range(run.start_step + 1, last + 1):
    state, metrics = run.train_step(state, next(run.batches))
    if log.held is not None:  # Its metrics are on the host by now.
      log.write()
      run.report_unreadable()
    if step % config.log_every_steps == 0 or step == last:
      log.hold(step, metrics)
    for hook in hooks:
      hook(step)
    stop = run.preemption.reached(step)  # The same answer on every process.
    if stop or step == last or step % config.checkpoint_every_steps == 0:
      _check_finite(step, metrics)
      log.write()
      run.report_unreadable()
      run.saver.save(step, state, force=stop or step == last)
      console.say("Step %d: saving a checkpoint to %s.", step,
                  run.saver.manager.directory / str(step))
      run.outputs.sync()
    if stop:  # Saved above, with the held metrics written.
      logging.warning(
          "Stopped at step %d after a preemption notice "
          "(SIGTERM); rerun the same command to continue.", step)
      return {**log.result, **evaluated, "preempted_at_step": float(step)}
    due = [e for e in run.evals if e.due(step, last)]
    if due:
      log.write()
      evaluated.update(_evaluate(due, state, run.outputs.writer, step))
      run.report_unreadable()
      run.outputs.sync()
  if run.start_step >= last:  # No step to take (total_steps=0, or a
    # finished run resumed): the evaluation of the weights as they are.
    evaluated = _evaluate(run.evals, state, run.outputs.writer, last)
    run.report_unreadable()
    run.outputs.sync()
  return {**log.result, **evaluated}


class _UnreadableReport:
  """At log steps, saves and evaluations (the same steps on every process):
  writes the unreadable images met so far into the workdir, and says how
  many there are, all processes' together, when the count has grown."""

  def __init__(self, found: unreadable.Collector):
    self.found = found
    self.said = 0
    self.summed = 0  # The processes' counts, summed, when last counted.

  def __call__(self):
    self.found.write()
    count = self.found.count
    if jax.process_count() > 1:
      # Every process has written its list once all have counted. Each
      # reads records from the whole split, so one file may be met by
      # several (in different epochs): process 0 counts distinct names.
      summed = int(np.sum(multihost_utils.process_allgather(np.int64(count))))
      if summed == self.summed:
        return
      self.summed = count = summed
      if jax.process_index() == 0:
        count = len({
            name for listed in self.found.path.parent.glob(
                f"{paths.UNREADABLE_FILES}.process*.txt")
            for name in listed.read_text().splitlines()
        })
    if count > self.said:
      self.said = count
      listed = self.found.path.parent / (f"{paths.UNREADABLE_FILES}*.txt"
                                         if jax.process_count() > 1 else
                                         self.found.path.name)
      console.say("Left out %d unreadable %s so far; %s listed in %s.", count,
                  "image" if count == 1 else "images",
                  "it is" if count == 1 else "they are", listed)


def _check_finite(step, metrics) -> float:
  """The step's loss; raises if it, or the updated parameters, diverged (the
  loss of step s is computed before update s, the parameter norm after)."""
  loss, param_norm = float(metrics["loss"]), float(metrics["param_norm"])
  if not (np.isfinite(loss) and np.isfinite(param_norm)):
    raise NonFiniteLossError(
        f"Training diverged at step {step} (loss {loss}, parameter norm "
        f"{param_norm}); nothing of this state was saved. Lower config.lr, "
        "check the data, or enable config.grad_clip_norm, then rerun to "
        "resume from the last checkpoint.")
  return loss


def _images_at(config):
  """The images of each step: config.batch_size, or with several sequence
  lengths the schedule's batch of that step."""
  if not config.get("sequence_lengths"):
    return lambda step: config.batch_size
  schedule = length_schedule.Schedule(config.sequence_lengths,
                                      config.token_budget, config.seed,
                                      jax.device_count())
  return lambda step: schedule.batch(step - 1)  # Step s trains batch s - 1.


class _Timer:
  """Step time, throughput and ETA between two writes of the train metrics."""

  def __init__(self, start_step: int, num_steps: int, images_at):
    self.num_steps, self.images_at = num_steps, images_at
    self.last_step, self.last_time = start_step, time.perf_counter()

  def lap(self, step: int) -> dict[str, float]:
    now = time.perf_counter()
    steps = max(step - self.last_step, 1)
    images = sum(self.images_at(s) for s in range(step - steps + 1, step + 1))
    step_s = (now - self.last_time) / steps
    self.last_step, self.last_time = step, now
    images_per_sec = images / steps / max(step_s, 1e-9)
    return {
        "step_time_s": step_s,
        "images_per_sec": images_per_sec,
        "images_per_sec_per_core": images_per_sec / jax.device_count(),
        "eta_s": step_s * (self.num_steps - step)
    }


def _log_train(writer, step, metrics, timer) -> dict[str, float]:
  loss = _check_finite(step, metrics)
  scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
  scalars.update(timer.lap(step))
  writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
  result, accuracy = {"train/loss": loss}, ""
  if "accuracy" in scalars:  # Masked patch prediction's, on corrupted patches.
    result["train/accuracy"] = scalars["accuracy"]
    accuracy = f", accuracy {scalars['accuracy']:.4f}"
  console.say("Step %d/%d: loss %.4f%s, lr %.3g, %.0f images/s, ETA %s.", step,
              timer.num_steps, loss, accuracy, scalars["learning_rate"],
              scalars["images_per_sec"],
              datetime.timedelta(seconds=round(scalars["eta_s"])))
  return result


def _evaluate(evals: list[evaluators.Scheduled], state, writer,
              step) -> dict[str, float]:
  """Runs `evals` on the state's eval params; writes and returns their
  metrics as NAME/metric."""
  result = {}
  for entry in evals:
    metrics = entry.evaluator.run(state.eval_params())
    scalars = {f"{entry.name}/{k}": v for k, v in metrics.items()}
    writer.write_scalars(step, scalars)
    console.say("Step %d: %s %s.", step, entry.name,
                entry.evaluator.summary(metrics))
    result.update(scalars)
  return result
