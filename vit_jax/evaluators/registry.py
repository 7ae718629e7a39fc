"""Evaluators are entries of `config.evals`, their types looked up here.

An entry `config.evals.NAME` (config/defaults.py: `eval_entry`) holds:

  type         a registered type, e.g. classification, fewshot, masked_patch
  every_steps  None: every config.eval_every_steps steps; 0: at the end only
  data         what it reads (vit_jax/data/specs.py: DATA_FIELDS; None keeps
               the config's evaluation data)
  ...          the type's own fields (`register`'s `fields`: their defaults)

Any number of entries, of any type. The loop runs each entry that applies to
the config's objective every `every_steps` steps and at the last step, and
writes its metrics as `NAME/metric`. A type is one function registered with
`@register(NAME, fields=..., applies=...)` in a module of its own (or of the
user's, loaded through config.imports): `make(entry, context) -> evaluator`,
given the entry resolved (`Entry`: its data spec built, its own fields with
their defaults), where an evaluator has `run(params) -> {metric: value}` and
`summary(metrics) -> str` (its console line).
"""

import dataclasses
from typing import Any
from typing import Callable
from typing import Optional

import ml_collections

from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.errors import UserError

# The fields every entry has besides its type's own.
COMMON_FIELDS = ("type", "every_steps", "data")


@dataclasses.dataclass(frozen=True)
class Context:
  """What a type's `make` gets besides its entry."""
  config: ml_collections.ConfigDict  # The whole config (its model, loss...).
  model: Any  # The model being trained.
  mesh: Any
  params_sharding: Any
  train_data: specs.DataSpec
  train_source: Any  # The training data's source (its classes, ...).

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
  # (config, own fields) -> whether the entry runs for this config.
  applies: Callable[[ml_collections.ConfigDict, dict], bool]


TYPES: dict[str, Type] = {}


def register(name: str, fields: Optional[dict] = None,
             applies: Optional[Callable] = None):
  """Registers the decorated `make(entry, context)` as the type `name`.
  `fields`: the type's own entry fields and their defaults;
  `applies(config, fields)` says whether an entry runs for a config (by
  default it always does)."""

  def add(make):
    if name in TYPES and TYPES[name].make is not make:
      raise ValueError(f"The evaluator type {name!r} is registered twice.")
    TYPES[name] = Type(make, dict(fields or {}), applies or
                       (lambda config, fields: True))
    return make

  return add


def _resolve(config, name: str) -> tuple[Type, Entry]:
  """The entry's type, and the entry resolved; refuses an unknown type or
  field, and data that does not build."""
  entry = config.evals[name]
  if entry.type not in TYPES:
    raise UserError(f"config.evals.{name}.type={entry.type!r} is not an "
                    f"evaluator type; known: {', '.join(sorted(TYPES))} (a "
                    "module of config.imports may register more).")
  kind = TYPES[entry.type]
  unknown = sorted(set(entry) - set(COMMON_FIELDS) - set(kind.fields))
  if unknown:
    raise UserError(f"config.evals.{name} ({entry.type}) has no field "
                    f"{', '.join(unknown)}; its fields: "
                    f"{', '.join(COMMON_FIELDS + tuple(kind.fields))}.")
  if entry.every_steps is not None and entry.every_steps < 0:
    raise UserError(f"config.evals.{name}.every_steps={entry.every_steps} "
                    "must be None (config.eval_every_steps), 0 (at the end) "
                    "or positive.")
  fields = {k: entry[k] if k in entry else v for k, v in kind.fields.items()}
  data = specs.evaluation(config, entry.data.to_dict(),
                          where=f"config.evals.{name}")
  return kind, Entry(name, data, fields)


def check(config: ml_collections.ConfigDict):
  """Before compiling: every entry's type exists, its fields are the
  type's, and its data builds."""
  for name in config.evals:
    _resolve(config, name)


def from_config(config, model, mesh, params_sharding, train_source):
  """[(name, every_steps, evaluator)] of the entries that apply."""
  context = Context(config, model, mesh, params_sharding,
                    specs.training(config), train_source)
  made = []
  for name, settings in config.evals.items():
    kind, entry = _resolve(config, name)
    if not kind.applies(config, entry.fields):
      continue
    every = (config.eval_every_steps
             if settings.every_steps is None else settings.every_steps)
    made.append((name, every, kind.make(entry, context)))
  return made
