"""Evaluators are entries of `config.evals`, their types looked up here.

An entry `config.evals.NAME` (config/defaults.py: `eval_entry`) holds:

  type         a registered type, e.g. classification, fewshot, masked_patch
  enabled      True: it runs (an error where its type cannot for the config);
               False: off (not even read); None (the defaults' entries):
               where its type applies to the config
  every_steps  None: every config.eval_every_steps steps; 0: at the end only
  data         what it reads (vit_jax/data/specs.py: DATA_FIELDS; None keeps
               the config's evaluation data)
  ...          the type's own fields (`register`'s `fields`: their defaults)

Any number of entries, of any type; they run in the order of their names
(a ConfigDict's keys are sorted) every `every_steps` steps and at the last
step, and write their metrics as `NAME/metric`. A type is one function
registered with `@register(NAME, ...)` in a module of its own (or of the
user's, loaded through config.imports): `make(entry, context) -> evaluator`,
given the entry resolved (`Entry`: its data spec built, its own fields with
their defaults), where an evaluator has `run(params) -> {metric: value}` and
`summary(metrics) -> str` (its console line).
"""

import dataclasses
from typing import Any
from typing import Callable
from typing import Optional

from absl import logging
import ml_collections

from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.errors import UserError

# The fields every entry has besides its type's own.
COMMON_FIELDS = ("type", "enabled", "every_steps", "data")


@dataclasses.dataclass(frozen=True)
class Context:
  """What a type's `make` gets besides its entry."""
  config: ml_collections.ConfigDict  # The whole config (its model, loss...).
  model: Any  # The model being trained.
  mesh: Any
  params_sharding: Any
  train_data: specs.DataSpec
  train_source: Any  # The training data's source (its classes, ...).
  # Gathers the unreadable files of the streams made (data/unreadable.py).
  unreadable: Any = None
  teachers: tuple = ()  # A distillation's (training/teachers.py: Teacher).

  def source(self, data: specs.DataSpec):
    """The source of `data`: the training data's where it is the same
    dataset (an image folder is then not listed again)."""
    same = lambda s: (s.dataset, s.data_dir, s.manual_dir, s.label_key)
    if same(data) == same(self.train_data):
      return self.train_source
    return sources.make_source(data)


@dataclasses.dataclass(frozen=True)
class Entry:
  """An entry of config.evals, resolved for its type's `make`."""
  name: str  # Its metrics are NAME/metric.
  data: specs.DataSpec  # What it reads (the config's evaluation data, with
  # the entry's `data` fields instead).
  fields: dict  # Its type's own fields, defaults filled in.


@dataclasses.dataclass(frozen=True)
class Type:
  make: Callable[[Entry, Context], Any]
  fields: dict  # The type's own fields and their defaults.
  # (config, own fields) -> why the entry cannot run for it; None: it runs.
  skip: Callable[[ml_collections.ConfigDict, dict], Optional[str]]
  reads: tuple[str, ...]  # The data fields it reads (others are refused).
  # config -> its data fields' defaults, where not the evaluation data's.
  data_defaults: Callable[[ml_collections.ConfigDict], dict]


TYPES: dict[str, Type] = {}


def _origin(function) -> tuple[str, str]:
  """Where a function is defined: the same after a module is reloaded or
  imported again under another name."""
  return (function.__code__.co_filename, function.__qualname__)


def register(name: str, fields: Optional[dict] = None,
             skip: Optional[Callable] = None,
             reads: tuple[str, ...] = specs.DATA_FIELDS,
             data_defaults: Optional[Callable] = None):
  """Registers the decorated `make(entry, context)` as the type `name`.

  fields: the type's own entry fields and their defaults.
  skip: `skip(config, fields)` says why an entry cannot run for a config
    (e.g. another objective), or None where it runs (the default).
  reads: the fields of `data` it reads; an entry setting another is refused.
  data_defaults: `data_defaults(config)`, its data fields' defaults where
    they are not the config's evaluation data's.
  """
  unknown = set(reads) - set(specs.DATA_FIELDS)
  if unknown:
    raise ValueError(f"Evaluator type {name!r} reads unknown data fields "
                     f"{sorted(unknown)}; known: {specs.DATA_FIELDS}.")

  def add(make):
    if name in TYPES and _origin(TYPES[name].make) != _origin(make):
      raise UserError(
          f"The evaluator type {name!r} is registered twice: by "
          f"{TYPES[name].make.__module__} and {make.__module__}; rename one.")
    TYPES[name] = Type(make, dict(fields or
                                  {}), skip or (lambda config, fields: None),
                       tuple(reads), data_defaults or (lambda config: {}))
    return make

  return add


def _resolve(config, name: str) -> tuple[Type, Entry]:
  """The entry's type, and the entry resolved; refuses an unknown type or
  field, data fields its type does not read, and data that does not build."""
  entry = config.evals[name]
  where = f"config.evals.{name}"
  if entry.type not in TYPES:
    raise UserError(f"{where}.type={entry.type!r} is not an evaluator type; "
                    f"known: {', '.join(sorted(TYPES))} (a module of "
                    "config.imports may register more).")
  kind = TYPES[entry.type]
  unknown = sorted(set(entry) - set(COMMON_FIELDS) - set(kind.fields))
  if unknown:
    raise UserError(f"{where} ({entry.type}) has no field "
                    f"{', '.join(unknown)}; its fields: "
                    f"{', '.join(COMMON_FIELDS + tuple(kind.fields))}.")
  if entry.every_steps is not None and entry.every_steps < 0:
    raise UserError(f"{where}.every_steps={entry.every_steps} must be None "
                    "(config.eval_every_steps), 0 (at the end) or positive.")
  data = {k: v for k, v in entry.data.items() if v is not None}
  unread = sorted(set(data) - set(kind.reads))
  if unread:
    raise UserError(f"{where}.data sets {', '.join(unread)}, which a "
                    f"{entry.type} evaluator does not read (it reads "
                    f"{', '.join(kind.reads)}); unset it.")
  fields = {k: entry[k] if k in entry else v for k, v in kind.fields.items()}
  data = specs.evaluation(config, {
      **kind.data_defaults(config),
      **data
  }, where=where)
  return kind, Entry(name, data, fields)


def _runs(config, name: str, kind: Type, entry: Entry, log=True) -> bool:
  """Whether the entry runs; refuses an enabled one its type cannot run."""
  enabled = config.evals[name].enabled
  reason = kind.skip(config, entry.fields)
  if reason and enabled:
    raise UserError(f"config.evals.{name} ({config.evals[name].type}) cannot "
                    f"run: {reason}. Set config.evals.{name}.enabled=False, "
                    "or remove the entry.")
  if reason and log:
    logging.info("config.evals.%s does not run: %s.", name, reason)
  return not reason


def check(config: ml_collections.ConfigDict):
  """Before compiling: every entry's type exists, its fields are the
  type's, its data builds, and an enabled entry can run."""
  for name in _not_off(config):
    _runs(config, name, *_resolve(config, name), log=False)


def _not_off(config) -> list[str]:
  """The entries not switched off (an off entry is not even resolved: its
  data may be missing here)."""
  return [
      name for name in config.evals if config.evals[name].enabled is not False
  ]


@dataclasses.dataclass(frozen=True)
class Scheduled:
  """An entry that runs: its evaluator and when."""
  name: str  # Its metrics are NAME/metric.
  every_steps: int  # 0: at the last step only.
  evaluator: Any  # `run(params) -> metrics`, `summary(metrics) -> str`.

  def due(self, step: int, last_step: int) -> bool:
    """Whether it runs after `step`: every `every_steps` and at the last
    step (a run stopped by a preemption notice does not get there)."""
    return step == last_step or bool(self.every_steps and
                                     step % self.every_steps == 0)


def from_config(config, model, mesh, params_sharding, train_source,
                unreadable=None, teachers=()) -> list[Scheduled]:
  """The entries that run, their evaluators made; `unreadable` (an
  `unreadable.Collector`) gathers their streams' unreadable files;
  `teachers`: a distillation's, loaded (`training/teachers.py`)."""
  context = Context(config, model, mesh, params_sharding,
                    specs.training(config), train_source, unreadable, teachers)
  made = []
  for name in _not_off(config):
    settings = config.evals[name]
    kind, entry = _resolve(config, name)
    if not _runs(config, name, kind, entry):
      continue
    every = (config.eval_every_steps
             if settings.every_steps is None else settings.every_steps)
    made.append(Scheduled(name, every, kind.make(entry, context)))
  return made
