r"""VTAB-1k: fine-tune one checkpoint on each task, then the benchmark's means.

    vit-jax vtab --config=configs/vtab.py --checkpoint=PATH \
        --workdir=workdirs/vtab [--tasks=dtd,clevr_count]

(`vit_jax/commands/vtab.py` is the command.) Each task is trained with
`trainer.train_and_evaluate` on the config with `config.dataset =
"vtab:TASK"` (the config's splits, train800val200 -> test or train800 ->
val200, are names every task resolves) in WORKDIR/TASK, which then holds
`result.json` (with the settings it was run with). A task with a
`result.json` is not run again; an unfinished one resumes from its last
checkpoint, so rerunning the same command after a failure or preemption
completes the benchmark. Either is refused when its settings (the config
but for logging, checkpointing, data locations and device layout) differ
from this run's. WORKDIR/vtab.json holds each task's accuracy, the
Natural / Specialized / Structured means and the VTAB score: the mean over
the tasks (not over the groups).
"""

import fnmatch
import json
import statistics
import uuid

import jax
import ml_collections

from vit_jax import console
from vit_jax import paths
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.data import sources
from vit_jax.data import vtab_tasks
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import trainer

RESULT_FILE = paths.VTAB_RESULT
SUMMARY_FILE = paths.VTAB_SUMMARY


def task_config(config: ml_collections.ConfigDict,
                task: str) -> ml_collections.ConfigDict:
  """The config with the task as its dataset, decided (`weights.decide`,
  as the trainer decides it, so it compares with the config.json and
  result.json of an earlier run)."""
  return weights.decide(_with_task(config, task))


def _with_task(config: ml_collections.ConfigDict,
               task: str) -> ml_collections.ConfigDict:
  config = config.copy_and_resolve_references()
  config.dataset = sources.VTAB_PREFIX + vtab_tasks.get(task).name
  return config


# Fields that do not change a task's result: where the data, the cache and
# the user's modules lie, how often the run logs, evaluates and saves, how
# evaluation batches, and the device layout (a preempted task may resume on
# another slice); fnmatch patterns over dotted names. All the others (lr,
# steps, batch, dont_load, ...) must match for a result or a checkpoint to
# be reused: listing what to ignore rather than what to compare keeps a
# field added later compared.
_NOT_COMPARED = ("data_dir", "manual_dir", "cache", "eval_batch_size",
                 "log_every_steps", "eval_every_steps",
                 "checkpoint_every_steps", "keep_checkpoints",
                 "keep_checkpoint_every_steps", "profile_steps",
                 "init.cache_dir", "mesh.*", "sharding.*", "imports",
                 "evals.*.every_steps", "evals.*.data.batch_size",
                 "evals.*.data.cache", "evals.*.data.data_dir",
                 "evals.*.data.manual_dir")
_ABSENT = object()


def _flatten(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def _settings(config_json: dict) -> dict:
  """{dotted field: value} of a config as JSON, without _NOT_COMPARED."""
  return {
      k: v
      for k, v in _flatten(config_json).items()
      if not any(fnmatch.fnmatchcase(k, p) for p in _NOT_COMPARED)
  }


def settings(config: ml_collections.ConfigDict) -> dict:
  """What makes two runs of a task the same (as JSON values)."""
  return _settings(json.loads(config.to_json_best_effort()))


def _differences(wanted: dict, recorded: dict) -> list[str]:
  """'field recorded -> wanted' for each field that differs. A run recorded
  by an earlier version lacks the fields added since: those count as their
  default; fields removed since are not compared."""
  show = lambda v: "absent" if v is _ABSENT else json.dumps(v)
  default = settings(defaults.get_config())
  lines = []
  for key in sorted(wanted):
    now, before = wanted[key], recorded.get(key, default.get(key, _ABSENT))
    if now != before:
      lines.append(f"{key} {show(before)} -> {show(now)}")
  return lines


def _check_same(what: str, wanted: dict, recorded: dict, directory):
  differences = _differences(wanted, recorded)
  if differences:
    raise UserError(
        f"{what} in {directory} has other settings than this run "
        f"(recorded -> now): {'; '.join(differences)}. Use another "
        f"--workdir (or delete {directory}) to fine-tune with these.")


def _write_atomically(path, text: str):
  """Readers (and a rerun after a crash) see the whole file or none: a
  temporary name, then a rename (epath: local or gs://)."""
  partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
  partial.write_text(text)
  partial.replace(path)


def run_task(config: ml_collections.ConfigDict, workdir, task: str):
  """The task's metrics (from its result.json if it was finished before);
  None where training stopped for a preemption. Refuses a result or an
  unfinished run of other settings."""
  config = task_config(config, task)
  wanted = settings(config)
  directory = paths.resolve(workdir) / task
  result_path = directory / RESULT_FILE
  if result_path.exists():
    done = json.loads(result_path.read_text())
    _check_same("The finished task", wanted, done["settings"], directory)
    console.say("VTAB %s: finished before, accuracy %.4f (not rerun).", task,
                done["metrics"]["test/accuracy"])
    return done["metrics"]
  started = directory / paths.CONFIG_FILE  # Written by the trainer.
  if started.exists():
    _check_same("The unfinished task", wanted,
                _settings(json.loads(started.read_text())), directory)
    console.say("VTAB %s: resuming in %s.", task, directory)
  else:
    console.say("VTAB %s: fine-tuning in %s.", task, directory)
  metrics = trainer.train_and_evaluate(config, str(directory))
  if "preempted_at_step" in metrics:
    return None
  if jax.process_index() == 0:
    _write_atomically(
        result_path,
        json.dumps({
            "settings": wanted,
            "metrics": metrics
        }, indent=2))
  return metrics


def run_tasks(config: ml_collections.ConfigDict, workdir,
              tasks=None) -> dict[str, float]:
  """{task: accuracy on the config's eval split} for `tasks` (default all
  19), in order; stops after a preemption with the tasks done so far."""
  tasks = list(tasks or vtab_tasks.TASKS)
  mesh = sharding.mesh_from_config(config)
  for task in tasks:  # Every name and config checked before hours of training.
    checks.check_config(_with_task(config, task), mesh)
  if config.init.checkpoint:  # A released name of another model: refused.
    weights.check_released_variant(config.init.checkpoint, config.model.variant)
  paths.make_workdir(workdir)
  accuracy = {}
  for task in tasks:
    metrics = run_task(config, workdir, task)
    if metrics is None:
      console.say(
          "Stopped in VTAB %s after a preemption notice; rerun the "
          "same command to continue.", task)
      break
    accuracy[task] = metrics["test/accuracy"]
  return accuracy


def summarize(accuracy: dict[str, float]) -> dict:
  """Per task, per group (Natural 7, Specialized 4, Structured 8 tasks) and
  overall means of the given tasks' accuracies. `mean` is the VTAB score:
  the mean over tasks; `complete` says whether all 19 are in."""
  unknown = sorted(set(accuracy) - set(vtab_tasks.TASKS))
  if unknown:
    raise UserError(f"Not VTAB tasks: {', '.join(unknown)}.")
  tasks = {
      name: {
          "group": vtab_tasks.TASKS[name].group,
          "accuracy": value
      } for name, value in accuracy.items()
  }
  groups = {}
  for group in vtab_tasks.GROUPS:
    values = [t["accuracy"] for t in tasks.values() if t["group"] == group]
    if values:
      groups[group] = statistics.fmean(values)
  return {
      "tasks": tasks,
      "groups": groups,
      "mean": statistics.fmean(accuracy.values()) if accuracy else None,
      "num_tasks": len(accuracy),
      "complete": len(accuracy) == len(vtab_tasks.TASKS)
  }


def format_table(summary: dict) -> str:
  """Task | group | accuracy, then the group means and the mean."""
  rows = [
      (name, t["group"], t["accuracy"]) for name, t in summary["tasks"].items()
  ]
  rows += [(f"mean {group}", "", value)
           for group, value in summary["groups"].items()]
  if summary["mean"] is not None:
    count = (f"all {summary['num_tasks']}" if summary["complete"] else
             f"{summary['num_tasks']} of {len(vtab_tasks.TASKS)}")
    rows.append((f"mean ({count} tasks)", "", summary["mean"]))
  width = max([len("task")] + [len(name) for name, _, _ in rows])
  lines = [f"{'task':<{width}}  {'group':<11}  accuracy"]
  lines += [
      f"{name:<{width}}  {group:<11}  {100 * value:7.2f}%"
      for name, group, value in rows
  ]
  return "\n".join(lines)


def write(summary: dict, config: ml_collections.ConfigDict, workdir) -> str:
  """WORKDIR/vtab.json: the summary with the splits it was measured on."""
  path = paths.make_workdir(workdir) / SUMMARY_FILE
  _write_atomically(
      path,
      json.dumps(
          {
              "train_split": config.train_split,
              "eval_split": config.eval_split,
              "checkpoint": config.init.checkpoint,
              **summary
          }, indent=2))
  return str(path)
