"""Optimizers, schedules, per-parameter lr/wd multipliers and freezing.

Parameters are addressed by regexes that must match their whole
'/'-joined path (e.g. `head/.*`, `Transformer/encoderblock_\\d+/.*`); the
first matching rule wins. A rule that matches no parameter is an error, so a
typo never silently trains (or freezes) the wrong thing.

    adam: clip -> Adam moments -> + wd * mult * param -> * -lr * lr_mult
    sgd:  clip -> + wd * mult * param -> momentum -> * -lr * lr_mult

Frozen parameters get no update and carry no optimizer state.
`config.layer_decay` multiplies the learning rate by depth (`layer_decay`).
"""

import re
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax.config import fields
from vit_jax.errors import UserError
from vit_jax.models.partitioning import is_scanned_block
from vit_jax.models.partitioning import param_path

OPTIMIZERS = ("adam", "sgd")
DECAY_TYPES = ("cosine", "linear", "constant")
MOMENTUM_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def check_config(config: ml_collections.ConfigDict):
  fields.check_choice(config, "optimizer", OPTIMIZERS)
  fields.check_choice(config, "decay_type", DECAY_TYPES)
  fields.check_choice(config, "mu_dtype", MOMENTUM_DTYPES)
  decay = config.layer_decay
  if decay is not None and not (isinstance(decay,
                                           (int, float)) and 0 < decay <= 1):
    raise UserError(f"config.layer_decay={decay!r} must be in (0, 1], e.g. "
                    "0.75 (timm's --layer-decay); None turns it off.")


def make_schedule(config: ml_collections.ConfigDict, total_steps: int,
                  warmup_steps: int) -> optax.Schedule:
  """Linear warmup to `lr`, then cosine/linear decay to 0 (or constant)."""
  warmup = min(warmup_steps, total_steps)
  decay_steps = max(total_steps - warmup, 1)
  decay = {
      "cosine": lambda: optax.cosine_decay_schedule(config.lr, decay_steps),
      "linear": lambda: optax.linear_schedule(config.lr, 0.0, decay_steps),
      "constant": lambda: optax.constant_schedule(config.lr),
  }[config.decay_type]()
  if warmup == 0:
    return decay
  return optax.join_schedules(
      [optax.linear_schedule(0.0, config.lr, warmup), decay], [warmup])


def _first_match(rules, path: str, default):
  for regex, value in rules:
    if re.fullmatch(regex, path):
      return value
  return default


def check_param_rules(config: ml_collections.ConfigDict, params):
  """Every regex of lr_mults, wd_mults and frozen matches some parameter."""
  paths = [
      param_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]
  for field in ("lr_mults", "wd_mults", "frozen"):
    regexes = ([r for r, _ in config[field]]
               if field != "frozen" else list(config[field]))
    for regex in regexes:
      if not any(re.fullmatch(regex, p) for p in paths):
        raise UserError(
            f"config.{field} regex {regex!r} matches no parameter (paths look "
            f"like {paths[0]!r}, {paths[-1]!r}); fix or remove it.")
  if config.frozen and all(
      any(re.fullmatch(r, p) for r in config.frozen) for p in paths):
    raise UserError("config.frozen freezes every parameter; nothing would "
                    "train.")


def _scale_per_param(rules: Sequence, default: float, add_params=False,
                     factor: float = 1.0) -> optax.GradientTransformation:
  """u -> u * mult(path) or, with `add_params`, u + factor * mult(path) * p."""

  def update(updates, state, params=None):

    def one(key_path, u, p):
      mult = _first_match(rules, param_path(key_path), default)
      if add_params:
        return u if mult == 0 else u + factor * mult * p.astype(u.dtype)
      return u if mult == 1 else u * mult

    return jax.tree_util.tree_map_with_path(
        one, updates, params if add_params else updates), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


# Where a parameter sits for layer decay: a block (looped, or scanned with a
# leading layer axis), the embeddings (before the blocks), or after them.
_BLOCK = re.compile(r"(?:^|/)(?:encoderblock_|MixerBlock_)(\d+)/")
_EMBEDDINGS = re.compile(
    r"^(?:embedding|cls|registers|mask_token|stem|conv_root|gn_root|"
    r"block\d+)(?:/|$)|(?:^|/)(?:posembed_input|pre_norm)/")


def layer_depths(params):
  """A tree of each parameter's depth: 0 the embeddings (patch and position
  embeddings, tokens, a hybrid's stem, CLIP's pre-norm), i + 1 block i, L + 1
  what follows the L blocks (final norms, heads); a scanned block's a
  vector over its leading layer axis. Returns (tree, L)."""
  paths = [(param_path(p), leaf)
           for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
  looped = {int(m[1]) for path, _ in paths if (m := _BLOCK.search(path))}
  scanned = [leaf.shape[0] for path, leaf in paths if is_scanned_block(path)]
  num_layers = max(looped, default=-1) + 1 or (scanned[0] if scanned else 0)

  def depth(key_path, leaf):
    path = param_path(key_path)
    if is_scanned_block(path):
      return np.arange(
          1, leaf.shape[0] + 1).reshape((-1,) + (1,) * (leaf.ndim - 1))
    block = _BLOCK.search(path)
    if block:
      return int(block[1]) + 1
    return 0 if _EMBEDDINGS.search(path) else num_layers + 1

  return jax.tree_util.tree_map_with_path(depth, params), num_layers


def _layer_decay(decay: float) -> optax.GradientTransformation:
  """u -> u * decay^(L + 1 - depth) (`layer_depths`)."""

  def update(updates, state, params=None):
    del params
    depths, num_layers = layer_depths(updates)
    return jax.tree.map(
        lambda u, d: u * jnp.asarray(decay**(num_layers + 1 - d), u.dtype),
        updates, depths), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int,
                   warmup_steps: int | None = None):
  """Returns (optax transformation, schedule)."""
  warmup = config.warmup_steps if warmup_steps is None else warmup_steps
  schedule = make_schedule(config, total_steps, warmup)
  momentum_dtype = MOMENTUM_DTYPES[config.mu_dtype]
  decay = _scale_per_param(config.wd_mults, 1.0, add_params=True,
                           factor=config.weight_decay)
  parts = []
  if config.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.optimizer == "adam":
    # The second moment stays fp32 whatever mu_dtype says.
    parts += [
        optax.scale_by_adam(b1=config.b1, b2=config.b2, mu_dtype=momentum_dtype)
    ]
    if config.weight_decay:
      parts.append(decay)
  else:
    if config.weight_decay:
      parts.append(decay)
    if config.momentum:
      parts.append(
          optax.trace(config.momentum, accumulator_dtype=momentum_dtype))
  parts.append(optax.scale_by_learning_rate(schedule))
  if config.lr_mults:
    parts.append(_scale_per_param(config.lr_mults, 1.0))
  if config.layer_decay is not None and config.layer_decay != 1:
    parts.append(_layer_decay(config.layer_decay))
  tx = optax.chain(*parts)
  if config.frozen:

    def labels(params):
      return jax.tree.map(lambda frozen: "frozen" if frozen else "trained",
                          frozen_mask(config.frozen, params))

    tx = optax.multi_transform({
        "trained": tx,
        "frozen": optax.set_to_zero()
    }, labels)
  return tx, schedule


def frozen_mask(frozen_regexes, params):
  """A tree of bools: which parameters a regex of config.frozen matches."""
  rules = [(regex, True) for regex in frozen_regexes]
  return jax.tree_util.tree_map_with_path(
      lambda p, _: _first_match(rules, param_path(p), False), params)


def stop_frozen_gradients(frozen_regexes, params):
  """`params` with `stop_gradient` on the frozen ones, so the backward pass
  skips their weight gradients (the optimizer zeroes their updates anyway)."""
  if not frozen_regexes:
    return params
  return jax.tree.map(
      lambda x, frozen: jax.lax.stop_gradient(x) if frozen else x, params,
      frozen_mask(frozen_regexes, params))


def ema_update(ema_params, params, step, decay: float):
  """Polyak averaging with TF's warm-up: the decay is min(decay, (1+t)/(10+t)),
  so early averages are not dominated by the random initialisation."""
  step = step.astype(jnp.float32)
  rate = jnp.minimum(decay, (1.0 + step) / (10.0 + step))
  return jax.tree.map(lambda e, p: rate * e + (1.0 - rate) * p, ema_params,
                      params)
