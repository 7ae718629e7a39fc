"""config.evals: entries resolved against their registered types (what an
entry may set, when it runs, what it reads by default)."""

import pytest

from configs import selfsup
from vit_jax import evaluators
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.evaluators import registry


@pytest.fixture
def config():
  config = defaults.get_config()
  defaults.runlocal(config)
  return config


def test_default_entries_carry_every_field_of_their_type(config):
  """So the command line can set each; a field added to a type and not to
  the defaults' entry fails here."""
  for name, entry in config.evals.items():
    own = {k: v for k, v in entry.items() if k not in registry.COMMON_FIELDS}
    assert own == registry.TYPES[entry.type].fields, name


def test_a_default_entry_runs_only_where_its_type_applies(config):
  runs = lambda: [e.name for e in _made(config)]
  assert runs() == ["test"]  # Supervised; fewshot has no datasets.
  config.objective = "masked_patch"
  assert runs() == ["masked_patch"]
  config.evals.fewshot.datasets = ("digits",)
  assert runs() == ["fewshot", "masked_patch"]  # In the order of names.
  config.evals.masked_patch.enabled = False
  assert runs() == ["fewshot"]


def _made(config):
  """from_config's entries, their `make` replaced by one returning None
  (nothing is built: no model, no data read)."""
  original = dict(registry.TYPES)
  try:
    for name, kind in original.items():
      registry.TYPES[name] = registry.Type(lambda entry, context: None,
                                           kind.fields, kind.skip, kind.reads,
                                           kind.data_defaults)
    return evaluators.from_config(config, None, None, None, None)
  finally:
    registry.TYPES.update(original)


def test_an_enabled_entry_that_cannot_run_is_refused(config):
  config.evals.masked_patch.enabled = True  # A supervised config.
  with pytest.raises(
      UserError, match=r"config.evals.masked_patch \(masked_patch\) cannot "
      r"run: config.objective='supervised' is evaluated by classification, "
      r"fewshot, not masked_patch"):
    evaluators.check(config)


def test_an_entry_switched_off_is_not_read(config):
  """Its data may be missing where the run is (e.g. ReaL's labels)."""
  config.evals.fewshot.datasets = ("digits",)
  config.evals.fewshot.data.pp = "no_such_op"
  with pytest.raises(UserError, match="no_such_op"):
    evaluators.check(config)
  config.evals.fewshot.enabled = False
  evaluators.check(config)


def test_data_a_type_does_not_read_is_refused(config):
  config.evals.fewshot.datasets = ("digits",)
  config.evals.fewshot.data.split = "test"  # The protocol's splits count.
  with pytest.raises(
      UserError, match="config.evals.fewshot.data sets split, which a "
      "fewshot evaluator does not read"):
    evaluators.check(config)


def test_unknown_types_and_fields_are_refused(config):
  config.evals.test.type = "accuracy"
  with pytest.raises(
      UserError, match="'accuracy' is not an evaluator type; "
      "known: classification, distill, fewshot, loss, mae, masked_patch"):
    evaluators.check(config)
  config.evals.test.type = "fewshot"  # Its fields are classification's.
  with pytest.raises(
      UserError, match="has no field average_label_sets, "
      "skip_unlabelled"):
    evaluators.check(config)


def test_fewshot_reads_the_protocols_preprocessing_by_default():
  config = selfsup.get_config("digits,runlocal")
  _, entry = registry._resolve(config, "fewshot")
  assert entry.data.pp == config.pp_eval  # config.fewshot.pp_eval is None.
  config.fewshot.pp_eval = "flip_lr|resize|value_range"
  _, entry = registry._resolve(config, "fewshot")
  assert entry.data.pp == config.fewshot.pp_eval != config.pp_eval
  config.evals.fewshot.data.pp = "resize|flip_lr|value_range"
  _, entry = registry._resolve(config, "fewshot")
  assert entry.data.pp == "resize|flip_lr|value_range"


def test_a_type_registered_twice_is_refused():

  def make(entry, context):
    del entry, context

  with pytest.raises(UserError, match="'classification' is registered twice"):
    evaluators.register("classification")(make)
  # The same function again (a module imported twice) is no error.
  kind = registry.TYPES["classification"]
  assert evaluators.register("classification", kind.fields, kind.skip)(
      kind.make) is kind.make
  registry.TYPES["classification"] = kind
  with pytest.raises(ValueError, match="reads unknown data fields"):
    evaluators.register("other", reads=("labels",))
