"""Training at several sequence lengths: one length per step, the batch
from a token budget, each step's images a pure function of (seed, step):
the same batches resumed, and on two processes as on one."""

import numpy as np
import pytest

from vit_jax.data import input_pipeline
from vit_jax.data import length_schedule
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import trainer


def test_the_schedule_draws_lengths_and_sums_batches():
  schedule = length_schedule.Schedule((16, 4, 9), 100, seed=3, multiple=4)
  assert schedule.lengths.tolist() == [4, 9, 16]
  assert schedule.batches.tolist() == [24, 8, 4]  # 100 // L, multiples of 4.
  chosen = schedule.choices(np.arange(3000))
  assert set(chosen.tolist()) == {0, 1, 2}
  assert abs(np.bincount(chosen) / 3000 - 1 / 3).max() < 0.05
  np.testing.assert_array_equal(chosen[:50], schedule.choices(np.arange(50)))
  positions = np.cumsum(schedule.batches[chosen])
  for step in (1, 17, 2999):
    assert schedule.first_position(step) == positions[step - 1]
  other = length_schedule.Schedule((16, 4, 9), 100, seed=4, multiple=4)
  assert not np.array_equal(other.choices(np.arange(50)), chosen[:50])


def _spec(config, **fields):
  config.sequence_length = 16
  config.sequence_lengths = (4, 16)
  config.token_budget = 128
  config.pp_train = "aspect_crop(0.5)|resize_to_sequence|value_range|patchify"
  config.update(fields)
  return specs.training(config)


def _batches(spec, source, start, steps, index=0, count=1):
  ds = input_pipeline.make_train_dataset(spec, source, process_index=index,
                                         process_count=count, start_step=start)
  return [b["image"] for b in ds.take(steps).as_numpy_iterator()]


def test_steps_follow_the_schedule_resume_and_split_over_processes(
    digits_config):
  spec = _spec(digits_config)
  source = input_pipeline.make_source(spec)
  schedule = length_schedule.Schedule((4, 16), 128, spec.seed, 1)
  whole = _batches(spec, source, 0, 12)
  for step, batch in enumerate(whole):
    length = schedule.length(step)
    assert batch["patches"].shape == (128 // length, length, 48)
    assert (batch["segments"].sum(1) <= length).all()
  for a, b in zip(whole[7:], _batches(spec, source, 7, 5)):  # Resumed.
    np.testing.assert_array_equal(a["patches"], b["patches"])
  halves = [_batches(spec, source, 3, 4, index=i, count=2) for i in (0, 1)]
  for step, (a, b) in enumerate(zip(*halves), 3):
    np.testing.assert_array_equal(np.concatenate([a["patches"], b["patches"]]),
                                  whole[step]["patches"])


def test_several_lengths_refuse_what_cannot_work(digits_config):
  config = digits_config
  config.sequence_lengths = (4, 16)
  config.pp_train = "resize_to_sequence|value_range|patchify"
  config.sequence_length = 16
  with pytest.raises(UserError, match="needs config.token_budget"):
    checks.check_batches(config, trainer.sharding.make_mesh())
  config.token_budget = 8
  with pytest.raises(UserError, match="holds no batch of 8 images"):
    checks.check_batches(config, trainer.sharding.make_mesh())


def test_training_at_several_lengths_runs_on_digits(digits_config, tmp_path):
  config = digits_config
  _spec(config, total_steps=4, eval_batch_size=64)
  config.model.classifier = "gap"
  config.pp_eval = "resize_to_sequence|value_range|patchify"
  metrics = trainer.train_and_evaluate(config, str(tmp_path / "lengths"))
  assert np.isfinite(metrics["train/loss"])
  assert metrics["test/num_examples"] == 360
