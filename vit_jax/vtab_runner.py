r"""VTAB-1k: fine-tune one checkpoint on each task, then the benchmark's means.

    vit-jax vtab --config=configs/vtab.py --checkpoint=PATH \
        --workdir=workdirs/vtab [--tasks=dtd,clevr_count]

(`vit_jax/vtab.py` is the command.) Each task is trained with
`trainer.train_and_evaluate` on the config with `config.dataset =
"vtab:TASK"` (the config's splits, train800val200 -> test or train800 ->
val200, are names every task resolves) in WORKDIR/TASK, which then holds
`result.json`. A task with a `result.json` is not run again; an unfinished
one resumes from its last checkpoint, so rerunning the same command after
a failure or preemption completes the benchmark. WORKDIR/vtab.json holds
each task's accuracy, the Natural / Specialized / Structured means and the
VTAB score: the mean over the tasks (not over the groups).
"""

import json
import statistics

import jax
import ml_collections

from vit_jax import console, paths, trainer
from vit_jax.data import sources, vtab_tasks
from vit_jax.errors import UserError

RESULT_FILE = "result.json"  # In each task's sub-workdir.
SUMMARY_FILE = "vtab.json"  # In the workdir.


def task_config(config: ml_collections.ConfigDict,
                task: str) -> ml_collections.ConfigDict:
  """The config with the task as its dataset (all else unchanged)."""
  config = config.copy_and_resolve_references()
  config.dataset = sources.VTAB_PREFIX + vtab_tasks.get(task).name
  return config


def _protocol(config: ml_collections.ConfigDict) -> dict:
  """What makes two results of a task comparable."""
  return {"dataset": config.dataset, "train_split": config.train_split,
          "eval_split": config.eval_split,
          "checkpoint": config.init.checkpoint,
          "variant": config.model.variant, "image_size": config.image_size}


def run_task(config: ml_collections.ConfigDict, workdir, task: str):
  """The task's metrics (from its result.json if it was finished before);
  None where training stopped for a preemption."""
  config = task_config(config, task)
  directory = paths.resolve(workdir) / task
  result_path = directory / RESULT_FILE
  if result_path.exists():
    done = json.loads(result_path.read_text())
    if done["protocol"] != _protocol(config):
      raise UserError(
          f"{result_path} is a result of {done['protocol']}, not of "
          f"{_protocol(config)}; use another --workdir (or delete "
          f"{directory}) to fine-tune again.")
    console.say("VTAB %s: finished before, accuracy %.4f (not rerun).", task,
                done["metrics"]["test/accuracy"])
    return done["metrics"]
  console.say("VTAB %s: fine-tuning in %s.", task, directory)
  metrics = trainer.train_and_evaluate(config, str(directory))
  if "preempted_at_step" in metrics:
    return None
  if jax.process_index() == 0:
    result_path.write_text(json.dumps(
        {"protocol": _protocol(config), "metrics": metrics}, indent=2))
  return metrics


def run_tasks(config: ml_collections.ConfigDict, workdir,
              tasks=None) -> dict[str, float]:
  """{task: accuracy on the config's eval split} for `tasks` (default all
  19), in order; stops after a preemption with the tasks done so far."""
  tasks = list(tasks or vtab_tasks.TASKS)
  for task in tasks:
    vtab_tasks.get(task)  # Every name checked before hours of training.
  paths.make_workdir(workdir)
  accuracy = {}
  for task in tasks:
    metrics = run_task(config, workdir, task)
    if metrics is None:
      console.say("Stopped in VTAB %s after a preemption notice; rerun the "
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
  tasks = {name: {"group": vtab_tasks.TASKS[name].group, "accuracy": value}
           for name, value in accuracy.items()}
  groups = {}
  for group in vtab_tasks.GROUPS:
    values = [t["accuracy"] for t in tasks.values() if t["group"] == group]
    if values:
      groups[group] = statistics.fmean(values)
  return {"tasks": tasks, "groups": groups,
          "mean": statistics.fmean(accuracy.values()) if accuracy else None,
          "num_tasks": len(accuracy),
          "complete": len(accuracy) == len(vtab_tasks.TASKS)}


def format_table(summary: dict) -> str:
  """Task | group | accuracy, then the group means and the mean."""
  rows = [(name, t["group"], t["accuracy"])
          for name, t in summary["tasks"].items()]
  rows += [(f"mean {group}", "", value)
           for group, value in summary["groups"].items()]
  if summary["mean"] is not None:
    count = (f"all {summary['num_tasks']}" if summary["complete"] else
             f"{summary['num_tasks']} of {len(vtab_tasks.TASKS)}")
    rows.append((f"mean ({count} tasks)", "", summary["mean"]))
  width = max([len("task")] + [len(name) for name, _, _ in rows])
  lines = [f"{'task':<{width}}  {'group':<11}  accuracy"]
  lines += [f"{name:<{width}}  {group:<11}  {100 * value:7.2f}%"
            for name, group, value in rows]
  return "\n".join(lines)


def write(summary: dict, config: ml_collections.ConfigDict, workdir) -> str:
  """WORKDIR/vtab.json: the summary with the splits it was measured on."""
  path = paths.make_workdir(workdir) / SUMMARY_FILE
  path.write_text(json.dumps(
      {"train_split": config.train_split, "eval_split": config.eval_split,
       "checkpoint": config.init.checkpoint, **summary}, indent=2))
  return str(path)
