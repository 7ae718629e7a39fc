"""Optimizer options: multipliers, freezing, momentum dtype, EMA, smoothing."""

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.objectives import supervised
from vit_jax.training import losses
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.training import train_state

PARAMS = {
    "head": {
        "kernel": jnp.ones((4, 3)),
        "bias": jnp.ones((3,))
    },
    "Transformer": {
        "encoder_norm": {
            "scale": jnp.ones((4,))
        }
    }
}
GRADS = jax.tree.map(lambda p: 0.5 * jnp.ones_like(p), PARAMS)


def _config(**overrides) -> ml_collections.ConfigDict:
  config = defaults.get_config()
  config.update(
      dict(warmup_steps=0, decay_type="constant", lr=0.1, grad_clip_norm=0.0,
           **overrides))
  return config


def _one_update(config):
  tx, _ = optim.make_optimizer(config, 10)
  state = tx.init(PARAMS)
  updates, state = tx.update(GRADS, state, PARAMS)
  return flax.traverse_util.flatten_dict(updates, sep="/"), state


def test_sgd_lr_and_wd_multipliers_apply_per_parameter():
  updates, _ = _one_update(
      _config(optimizer="sgd", momentum=0.0, weight_decay=0.2,
              lr_mults=(("head/.*", 10.0),), wd_mults=((".*/bias", 0.0),)))
  # -lr * lr_mult * (grad + wd * wd_mult * param)
  np.testing.assert_allclose(updates["head/kernel"], -0.1 * 10 * (0.5 + 0.2))
  np.testing.assert_allclose(updates["head/bias"], -0.1 * 10 * 0.5)
  np.testing.assert_allclose(updates["Transformer/encoder_norm/scale"],
                             -0.1 * (0.5 + 0.2))


def test_adam_weight_decay_is_decoupled():
  updates, _ = _one_update(_config(optimizer="adam", weight_decay=0.3))
  # The first Adam step is sign(grad) (up to eps); decay is added after it.
  np.testing.assert_allclose(updates["head/bias"], -0.1 * (1.0 + 0.3),
                             rtol=1e-5)


def test_frozen_parameters_do_not_move_and_carry_no_state():
  config = _config(optimizer="adam", frozen=("Transformer/.*",))
  updates, state = _one_update(config)
  assert not np.any(updates["Transformer/encoder_norm/scale"])
  assert np.all(updates["head/kernel"] != 0)
  trained_state = state.inner_states["trained"].inner_state
  moments = jax.tree.leaves(trained_state)
  # Adam's mu and nu exist for the two head arrays only (plus the step
  # counts of Adam and of the schedule).
  assert sum(x.size for x in moments) == 2 * (12 + 3) + 2


def test_bf16_first_moment_keeps_fp32_second_moment():
  _, state = _one_update(_config(optimizer="adam", mu_dtype="bfloat16"))
  adam = state[0]
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype("bfloat16")}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype("float32")}


@pytest.mark.parametrize("field, value",
                         [("lr_mults", (("heads/.*", 2.0),)),
                          ("wd_mults", (("cls", 0.0),)),
                          ("frozen", ("Transformer/encoderblock_9/.*",)),
                          ("frozen", (".*",))])
def test_rules_that_match_nothing_or_everything_are_errors(field, value):
  config = _config(**{field: value})
  with pytest.raises(ValueError, match=f"config.{field}|freezes every"):
    optim.check_param_rules(config, PARAMS)


def test_ema_follows_tf_warmup_then_the_decay():
  ema = {"w": jnp.zeros(())}
  params = {"w": jnp.ones(())}
  early = optim.ema_update(ema, params, jnp.array(0), 0.9999)
  np.testing.assert_allclose(early["w"], 1 - 1 / 10, rtol=1e-6)
  late = optim.ema_update(ema, params, jnp.array(10**6), 0.9999)
  np.testing.assert_allclose(late["w"], 1 - 0.9999, rtol=1e-3)


def _step_and_state(digits_config, ema_decay=0.0, label_smoothing=0.0):
  """The `testing` model, SGD at a constant lr, and a random batch."""
  from vit_jax import models
  digits_config.update(
      dict(optimizer="sgd", warmup_steps=0, decay_type="constant",
           grad_clip_norm=0.0))
  digits_config.model.variant = "testing"
  model = models.build_model(weights.decide(digits_config).model, 10)
  tx, schedule = optim.make_optimizer(digits_config, 10)
  mesh = sharding.make_mesh()
  state, shardings = train_state.create_train_state(model, tx, 16, 0, mesh,
                                                    ema=ema_decay > 0)
  step = steps.jit_train_step(
      steps.make_train_step(
          model, tx,
          supervised.classification_loss(losses.softmax_xent, label_smoothing),
          schedule, mesh, ema_decay=ema_decay), shardings, mesh)
  rng = np.random.default_rng(0)
  local = {
      "image": rng.uniform(-1, 1, (32, 16, 16, 3)).astype(np.float32),
      "labels": np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)]
  }
  return model, state, step, local, sharding.to_global_batch(local, mesh)


def test_ema_over_several_steps_equals_a_hand_computed_average(digits_config):
  decay = 0.2  # Below the warm-up rate from step 2 on: both branches run.
  digits_config.lr = 0.5  # Big steps: the average's weights show clearly.
  _, state, step, _, batch = _step_and_state(digits_config, ema_decay=decay)
  expected = jax.device_get(state.params)  # The average starts at init.
  first = expected
  for t in range(5):
    state, _ = step(state, batch)
    params = jax.device_get(state.params)
    rate = min(decay, (1 + t) / (10 + t))
    expected = jax.tree.map(lambda e, p, r=rate: r * e + (1 - r) * p, expected,
                            params)
    ema = jax.device_get(state.ema_params)
    jax.tree.map(
        lambda e, w: np.testing.assert_allclose(e, w, rtol=2e-6, atol=1e-8),
        ema, expected)
  moved = max(
      np.abs(a - b).max()
      for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(first)))
  assert moved > 1e-2  # The parameters really moved.
  lag = max(
      np.abs(a - b).max()
      for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(params)))
  assert lag > 1e-4  # The average is not just the parameters.
  assert state.eval_params() is state.ema_params


def test_label_smoothing_loss_equals_independent_computation(digits_config):
  smoothing = 0.3
  model, state, step, local, batch = _step_and_state(digits_config,
                                                     label_smoothing=smoothing)
  # A random head, so predictions are not uniform (the zero-initialised head
  # gives ln(10) whatever the targets are).
  head = state.params["head"]["kernel"]
  random_head = np.random.default_rng(1).normal(size=head.shape)
  params = {
      **state.params, "head": {
          **state.params["head"], "kernel": jax.device_put(
              random_head.astype(np.float32), head.sharding)
      }
  }
  logits = np.asarray(
      model.apply({"params": params}, local["image"])[0], np.float64)
  _, metrics = step(state.replace(params=params), batch)
  log_p = logits - logits.max(-1, keepdims=True)
  log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
  targets = (1 - smoothing) * local["labels"] + smoothing / 10
  smoothed = np.mean(-np.sum(targets * log_p, -1))
  plain = np.mean(-np.sum(local["labels"] * log_p, -1))
  assert abs(smoothed - plain) > 0.05  # Smoothing changes this loss.
  np.testing.assert_allclose(float(metrics["loss"]), smoothed, rtol=1e-5)


def test_smoothed_loss_matches_hand_computation():
  logits = jnp.array([[2.0, 0.0, -1.0]])
  labels = jnp.array([[1.0, 0.0, 0.0]])
  smoothed = optax.smooth_labels(labels, 0.3)
  expected = -np.sum(np.array([0.8, 0.1, 0.1]) * jax.nn.log_softmax(logits)[0])
  np.testing.assert_allclose(
      losses.softmax_xent(logits, smoothed)[0], expected, rtol=1e-6)


def test_frozen_parameters_cost_no_backward_pass():
  """With the encoder frozen the compiled step does fewer FLOPs (no weight
  gradients for it), and the update equals the one computed with every
  gradient (the optimizer zeroes the frozen ones either way)."""
  from vit_jax import models
  config = _config(optimizer="adam",
                   frozen=("Transformer/encoderblock_.*", "embedding/.*"))
  config.model.variant = "testing"
  model = models.build_model(weights.decide(config).model, 10)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  tx, schedule = optim.make_optimizer(config, 10)
  state, state_sharding = train_state.create_train_state(model, tx, 16, 0, mesh)
  rng = np.random.default_rng(0)
  batch = {
      "image": rng.uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32),
      "labels": np.eye(10, dtype=np.float32)[rng.integers(0, 10, 4)]
  }

  def step_with(frozen):
    step = steps.jit_train_step(
        steps.make_train_step(
            model, tx, supervised.classification_loss(losses.softmax_xent),
            schedule, mesh, frozen=frozen), state_sharding, mesh)
    flops = step.lower(state, batch).compile().cost_analysis()["flops"]
    new_state, _ = step(jax.tree.map(jnp.copy, state), batch)
    return flops, jax.device_get(new_state.params)

  all_flops, all_params = step_with(())
  frozen_flops, frozen_params = step_with(tuple(config.frozen))
  assert frozen_flops < 0.8 * all_flops, (frozen_flops, all_flops)
  jax.tree.map(np.testing.assert_array_equal, all_params, frozen_params)
