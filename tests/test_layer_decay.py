"""Layer-wise lr decay: the lr multiplier of every parameter of SigLIP, LiT
and MAE (looped and scanned) against tables written here by hand; of a
ViT, a hybrid, a Mixer and a masked-patch model at their landmarks.

Each table gives k per parameter, the lr multiplier being d^k: with L
blocks in a tower, k = L + 1 for its embeddings, L - i for its block i, 0
for what follows the blocks (BEiT's and timm's rule, per tower)."""

import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import image_text as image_text_configs
from configs import mae as mae_configs
from tests.helpers import tiny_models
from vit_jax import models
from vit_jax import objectives
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.models import masked_patch
from vit_jax.models import scan
from vit_jax.training import optim

D, LR = 0.5, 0.1
# The parameters of one of our encoder blocks, and of a MAP head.
_BLOCK = ("LayerNorm_0/bias", "LayerNorm_0/scale", "LayerNorm_2/bias",
          "LayerNorm_2/scale", "MlpBlock_3/Dense_0/bias",
          "MlpBlock_3/Dense_0/kernel", "MlpBlock_3/Dense_1/bias",
          "MlpBlock_3/Dense_1/kernel") + tuple(
              f"MultiHeadDotProductAttention_1/{proj}/{w}"
              for proj in ("query", "key", "value", "out")
              for w in ("bias", "kernel"))
_MAP_HEAD = ("LayerNorm_0/bias", "LayerNorm_0/scale", "MlpBlock_0/Dense_0/bias",
             "MlpBlock_0/Dense_0/kernel", "MlpBlock_0/Dense_1/bias",
             "MlpBlock_0/Dense_1/kernel", "probe") + tuple(
                 f"MultiHeadDotProductAttention_0/{proj}/{w}"
                 for proj in ("query", "key", "value", "out")
                 for w in ("bias", "kernel"))
_NORM = ("bias", "scale")
_DENSE = ("bias", "kernel")


def _each(prefix: str, names, k: int) -> dict:
  return {f"{prefix}/{name}": k for name in names}


def _blocks(prefix: str, ks) -> dict:
  """Block i of the encoder at `prefix`: ks[i] for each of its parameters."""
  return {
      f"{prefix}/encoderblock_{i}/{name}": k for i, k in enumerate(ks)
      for name in _BLOCK
  }


# SigLIP (siglip_b16's form: a MAP-pooled image tower with a learned table
# and no projection), both towers 2 blocks.
SIGLIP = {
    **_each("img/embedding", _DENSE, 3),
    "img/Transformer/posembed_input/pos_embedding": 3,
    **_blocks("img/Transformer", (2, 1)),
    **_each("img/Transformer/encoder_norm", _NORM, 0),
    **_each("img/MAPHead_0", _MAP_HEAD, 0),
    "txt/Embed_0/embedding": 3,
    "txt/pos_embedding": 3,
    **_blocks("txt/Encoder_0", (2, 1)),
    **_each("txt/Encoder_0/encoder_norm", _NORM, 0),
    **_each("txt/head", _DENSE, 0),
    "t": 0,
    "b": 0,
}
# LiT on the digits: the image tower of configs/digits.py (4 blocks, class
# token, learned table), a 2-block text tower: each over its own depth.
LIT = {
    **_each("img/embedding", _DENSE, 5),
    "img/cls": 5,
    "img/Transformer/posembed_input/pos_embedding": 5,
    **_blocks("img/Transformer", (4, 3, 2, 1)),
    **_each("img/Transformer/encoder_norm", _NORM, 0),
    "txt/Embed_0/embedding": 3,
    "txt/pos_embedding": 3,
    **_blocks("txt/Encoder_0", (2, 1)),
    **_each("txt/Encoder_0/encoder_norm", _NORM, 0),
    **_each("txt/head", _DENSE, 0),
    "t": 0,
    "b": 0,
}
# MAE: a 2-block encoder; its decoder learns at the full lr, as a head.
MAE = {
    **_each("embedding", _DENSE, 3),
    "cls": 3,
    "Transformer/posembed_input/pos_embedding": 3,
    **_blocks("Transformer", (2, 1)),
    **_each("Transformer/encoder_norm", _NORM, 0),
    **_each("mae_decoder/embed", _DENSE, 0),
    "mae_decoder/mask_token": 0,
    **_blocks("mae_decoder/Transformer", (0,)),
    **_each("mae_decoder/Transformer/encoder_norm", _NORM, 0),
    **_each("mae_decoder/pred", _DENSE, 0),
}


def _recipe(name: str, scan_layers: bool):
  """(parameters, config) of a recipe's model, its towers `testing`-sized."""
  if name == "mae":
    config = mae_configs.get_config("digits,runlocal").unlock()
  elif name == "lit":
    config = image_text_configs.get_config("lit_digits,runlocal").unlock()
    config.text.variant = "testing"
  else:
    config = image_text_configs.get_config("siglip_b16,runlocal").unlock()
  config.model.scan_layers = scan_layers
  model = objectives.model(objectives.decide(config), None)
  shapes = models.param_shapes(model, config.image_size)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), config


def _stacked(table: dict) -> dict:
  """The table of the same model with scan_layers: a looped encoder's
  block i is row i of `encoderblock` (MAE's decoder is never scanned)."""
  out = {}
  for path, k in table.items():
    encoder, sep, rest = path.partition("/encoderblock_")
    if not sep or encoder.startswith("mae_decoder"):
      out[path] = k
      continue
    block, name = rest.split("/", 1)
    rows = out.setdefault(f"{encoder}/encoderblock/{name}", [])
    assert len(rows) == int(block)
    rows.append(k)
  return out


def _lr_multipliers(params, **overrides) -> dict:
  """Each parameter's step under SGD (lr 0.1, unit gradients) / -lr."""
  config = defaults.get_config()
  config.update(
      dict(optimizer="sgd", momentum=0.0, weight_decay=0.0, lr=LR,
           warmup_steps=0, decay_type="constant", grad_clip_norm=0.0,
           layer_decay=D, **overrides))
  optim.check_config(config)
  optim.check_param_rules(config, params)
  tx, _ = optim.make_optimizer(config, 10)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  return {
      path: np.asarray(u) / -LR
      for path, u in flax.traverse_util.flatten_dict(updates, sep="/").items()
  }


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("name", ["siglip", "lit", "mae"])
def test_every_parameter_of_siglip_lit_and_mae_learns_at_its_depth(
    name, scan_layers):
  """The whole table, no parameter left out; a parameter config.frozen
  matches (LiT's image tower) does not move, nor changes the others'."""
  params, config = _recipe(name, scan_layers)
  table = {"siglip": SIGLIP, "lit": LIT, "mae": MAE}[name]
  want = _stacked(table) if scan_layers else table
  for frozen in {(), tuple(config.frozen)}:
    got = _lr_multipliers(params, frozen=frozen)
    assert sorted(got) == sorted(want)
    for path, k in want.items():
      shape, k = got[path].shape, np.asarray(k, np.float64)
      expected = np.broadcast_to(
          D**k.reshape(k.shape + (1,) * (len(shape) - k.ndim)), shape)
      if any(re.fullmatch(regex, path) for regex in frozen):
        expected = np.zeros(shape)
      np.testing.assert_allclose(got[path], expected, rtol=1e-6, err_msg=path)


def test_vit_hybrid_masked_patch_and_mixer_keep_their_depths():
  """Of L = 2 blocks: the patch embedding, class token, registers, position
  table, a hybrid's ResNet stem and masked patch prediction's [mask] token
  at d^3, block 0 at d^2, block 1 at d, the final norms, pooling and heads
  at 1 (lr_mults on top); a scanned model's stacked blocks row by row."""
  vit = tiny_models.vit(num_classes=3, hidden_size=8, mlp_dim=16, num_heads=2,
                        num_layers=2, patch_size=4, num_registers=1,
                        pre_norm=True, representation_size=4)
  params = vit.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))["params"]
  hybrid = tiny_models.with_size(models.create_model("testing-hybrid", 3),
                                 num_layers=2)
  mixer = tiny_models.mixer(num_classes=3, hidden_size=8, tokens_mlp_dim=4,
                            channels_mlp_dim=16, num_layers=2, patch_size=4)
  patch = masked_patch.MaskedPatchViT(
      tiny_models.vit(hidden_size=8, mlp_dim=16, num_heads=2, num_layers=2,
                      patch_size=4), outputs=5)
  cases = {
      "vit": (params, {
          "embedding/kernel": 3,
          "cls": 3,
          "registers": 3,
          "Transformer/posembed_input/pos_embedding": 3,
          "Transformer/pre_norm/scale": 3,
          "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": 2,
          "Transformer/encoderblock_1/LayerNorm_0/scale": 1,
          "Transformer/encoder_norm/scale": 0,
          "pre_logits/kernel": 0,
          "head/kernel": 0,
      }),
      "hybrid": (hybrid.init(jax.random.key(0), jnp.zeros(
          (1, 32, 32, 3)))["params"], {
              "conv_root/kernel": 3,
              "gn_root/scale": 3,
              "block1/unit1/conv1/kernel": 3,
              "block2/unit1/gn_proj/bias": 3,
              "embedding/kernel": 3,
              "Transformer/encoderblock_0/LayerNorm_2/bias": 2,
              "Transformer/encoderblock_1/LayerNorm_2/bias": 1,
              "head/bias": 0,
          }),
      "mixer": (mixer.init(jax.random.key(0), jnp.zeros(
          (1, 8, 8, 3)))["params"], {
              "stem/kernel": 3,
              "MixerBlock_0/token_mixing/Dense_0/kernel": 2,
              "MixerBlock_1/channel_mixing/Dense_1/bias": 1,
              "pre_head_layer_norm/scale": 0,
              "head/kernel": 0,
          }),
      "masked_patch": (patch.init(jax.random.key(0), jnp.zeros(
          (1, 8, 8, 3)))["params"], {
              "mask_token": 3,
              "embedding/bias": 3,
              "Transformer/encoderblock_0/LayerNorm_0/bias": 2,
              "Transformer/encoderblock_1/LayerNorm_0/bias": 1,
              "masked_patch_head/Dense_1/kernel": 0,
          }),
  }
  for name, (tree, want) in cases.items():
    got = _lr_multipliers(tree, lr_mults=(("(head|mask_token)/?.*", 10.0),))
    for path, k in want.items():
      mult = 10.0 if path.startswith(("head/", "mask_token")) else 1.0
      np.testing.assert_allclose(got[path], mult * D**k, rtol=1e-6,
                                 err_msg=f"{name}: {path}")
  got = _lr_multipliers(scan.stack_layers(params))
  kernel = got["Transformer/encoderblock/MlpBlock_3/Dense_0/kernel"]
  np.testing.assert_allclose(kernel[0], D**2, rtol=1e-6)
  np.testing.assert_allclose(kernel[1], D, rtol=1e-6)
  np.testing.assert_allclose(got["cls"], D**3, rtol=1e-6)


def test_a_parameter_without_a_depth_is_refused_before_training():
  """A name layer decay does not know gets no guessed depth: the check
  that runs before compiling names it, and only with layer_decay on."""
  params = {
      "embedding": {
          "kernel": jnp.ones((2, 2))
      },
      "Transformer": {
          "encoderblock_0": {
              "LayerNorm_0": {
                  "scale": jnp.ones(2)
              }
          }
      },
      "fc_norm": {
          "scale": jnp.ones(2)
      },
  }
  config = defaults.get_config()
  optim.check_param_rules(config, params)
  config.layer_decay = 0.75
  with pytest.raises(UserError, match="cannot place parameter 'fc_norm/scale'"):
    optim.check_param_rules(config, params)


def test_layer_decay_outside_zero_to_one_is_refused():
  config = defaults.get_config()
  config.layer_decay = 1.5
  with pytest.raises(UserError, match="layer_decay=1.5 must be in"):
    optim.check_config(config)
