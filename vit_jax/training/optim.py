"""Optimizers, schedules, per-parameter lr/wd multipliers and freezing.

Parameters are addressed by regexes that must match their whole
'/'-joined path (e.g. `head/.*`, `Transformer/encoderblock_\\d+/.*`); the
first matching rule wins. A rule that matches no parameter is an error, so a
typo never silently trains (or freezes) the wrong thing.

    adam: clip -> Adam moments -> + wd * mult * param -> * -lr * lr_mult
    sgd:  clip -> + wd * mult * param -> momentum -> * -lr * lr_mult

Frozen parameters get no update and carry no optimizer state.
`config.layer_decay` scales the learning rate by depth, per tower
(`decay_exponents`).
"""

import collections
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax.config import fields
from vit_jax.errors import UserError
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
  """Every regex of lr_mults, wd_mults and frozen matches some parameter;
  with layer_decay, every parameter has a depth."""
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
  if config.layer_decay is not None and config.layer_decay != 1:
    decay_exponents(params)  # Refuses a parameter it cannot place.


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


# Layer-wise lr decay places each parameter by its path inside its tower: a
# two-tower model's `img/` and `txt/` each decay over their own blocks; any
# other model is one tower. A path that is no embedding, block or what
# follows the blocks is refused by name rather than given a guessed depth.
_TOWERS = ("img", "txt")
_ENCODER = r"(?:Transformer|Encoder_0)/"  # The ViT's, the text tower's.
# Patch, token and position embeddings, class token, registers, [mask]
# token, a Mixer's or a hybrid's stem, CLIP's pre-norm: depth 0.
_EMBEDDINGS = re.compile(
    r"(?:embedding|Embed_0|stem|conv_root|gn_root|block\d+)/.+|"
    r"cls|registers|mask_token|pos_embedding|"
    rf"{_ENCODER}(?:posembed_input|pre_norm)/.+")
_BLOCK = re.compile(rf"{_ENCODER}encoderblock_(\d+)/.+|MixerBlock_(\d+)/.+")
# scan_layers: one block whose parameters lead with the layer axis.
_SCANNED = re.compile(rf"{_ENCODER}encoderblock/.+")
# After the blocks, at the full lr: final norms, poolers and heads, MAE's
# decoder (a head trained from scratch, dropped after pre-training) and the
# two towers' temperature and bias.
_TOP = re.compile(
    rf"{_ENCODER}encoder_norm/.+|(?:MAPHead_0|pooled_norm|pre_logits|head|"
    r"pre_head_layer_norm|masked_patch_head|mae_decoder)/.+|t|b")


def _place(path: str) -> tuple[str, str, int]:
  """(tower, kind, block): kind "embeddings", "block", "scanned" or "top"."""
  tower, _, rest = path.partition("/")
  if tower not in _TOWERS or not rest:
    tower, rest = "", path
  if _EMBEDDINGS.fullmatch(rest):
    return tower, "embeddings", 0
  if _TOP.fullmatch(rest):
    return tower, "top", 0
  if block := _BLOCK.fullmatch(rest):
    return tower, "block", int(block[1] or block[2])
  if _SCANNED.fullmatch(rest):
    return tower, "scanned", 0
  raise UserError(
      f"config.layer_decay cannot place parameter {path!r} at a depth (not "
      "an embedding, block or head that vit_jax/training/optim.py knows); "
      "add its name there or set config.layer_decay=None.")


def decay_exponents(params):
  """A tree of k per parameter: `layer_decay` d scales its lr by d^k.

  BEiT's depths within each tower of L blocks: 0 the embeddings, i + 1
  block i, L + 1 what follows, and k = L + 1 - depth; a scanned block's k
  is a vector over its leading layer axis. Heads, MAE's decoder and the
  towers' temperature and bias: k = 0."""
  leaves = [(param_path(p), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
  places = {path: _place(path) for path, _ in leaves}
  num_layers = collections.defaultdict(int)
  for path, leaf in leaves:
    tower, kind, block = places[path]
    layers = {"block": block + 1, "scanned": leaf.shape[0]}.get(kind, 0)
    num_layers[tower] = max(num_layers[tower], layers)

  def exponent(key_path, leaf):
    tower, kind, block = places[param_path(key_path)]
    layers = num_layers[tower]
    if kind == "scanned":  # Row i is block i.
      return np.arange(layers, 0, -1).reshape((-1,) + (1,) * (leaf.ndim - 1))
    return {"embeddings": layers + 1, "block": layers - block, "top": 0}[kind]

  return jax.tree_util.tree_map_with_path(exponent, params)


def _layer_decay(decay: float) -> optax.GradientTransformation:
  """u -> u * decay^k (`decay_exponents`)."""

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, k: u * jnp.asarray(decay**k, u.dtype),
                        updates, decay_exponents(updates)), state

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
  layer_decay = config.layer_decay is not None and config.layer_decay != 1
  if layer_decay and not config.frozen:
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
    if layer_decay:  # Outside the mask: a tower's depth counts frozen blocks.
      tx = optax.chain(tx, _layer_decay(config.layer_decay))
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
