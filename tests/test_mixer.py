"""MLP-Mixer: an independent float64 forward, golden parameter counts, the
released names, parity with timm through its stored state dict and logits
(tests/references), and the timm layout both ways."""

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import numpy_mixer
from tests.helpers import numpy_reference
from tests.helpers.tiny_models import mixer
from tests.references import stored
from vit_jax import models
from vit_jax import weights
from vit_jax.errors import WeightsError
from vit_jax.models import VARIANTS
from vit_jax.models import MixerVariant
from vit_jax.models.mixer import MixerBlock

# models/variants.py's Mixer rows, as MlpMixer's fields.
MIXER_VARIANTS = {
    name: dataclasses.asdict(v)
    for name, v in VARIANTS.items()
    if isinstance(v, MixerVariant)
}

# 1000 classes at 224 px. B/16, B/32 and L/16 are the released code's
# pinned counts (vision_transformer's models_test.py); the paper's Table 1
# rounds the others without the head (S/32 19M ... H/14 431M).
GOLDEN_PARAM_COUNTS = {
    "Mixer-S/32": 19_104_624,
    "Mixer-S/16": 18_528_264,
    "Mixer-B/32": 60_293_428,
    "Mixer-B/16": 59_880_472,
    "Mixer-L/32": 206_939_264,
    "Mixer-L/16": 208_196_168,
    "Mixer-H/14": 432_350_952,
    "testing-mixer": 126_728,
    "digits-mixer": 1_017_128,
}
TINY = MIXER_VARIANTS["testing-mixer"]
TIMM_LIKE = dict(hidden_size=32, tokens_mlp_dim=16, channels_mlp_dim=128,
                 num_layers=2, patch_size=8)  # tests/references' tiny Mixer.


def closed_form_count(hidden_size, tokens_mlp_dim, channels_mlp_dim, num_layers,
                      patch_size, image_size=224, classes=1000):
  """The architecture's arithmetic: Dense (in + 1) * out, LayerNorm 2 * D."""
  tokens = (image_size // patch_size)**2
  dense = lambda fan_in, fan_out: (fan_in + 1) * fan_out
  block = (2 * 2 * hidden_size + dense(tokens, tokens_mlp_dim) +
           dense(tokens_mlp_dim, tokens) +
           dense(hidden_size, channels_mlp_dim) +
           dense(channels_mlp_dim, hidden_size))
  stem = dense(patch_size * patch_size * 3, hidden_size)
  return (stem + num_layers * block + 2 * hidden_size +
          dense(hidden_size, classes))


def abstract_params(model, size):
  return jax.eval_shape(lambda: model.init(jax.random.key(
      0), jnp.zeros((1, size, size, 3)))["params"])


@pytest.mark.parametrize("name", sorted(MIXER_VARIANTS))
def test_golden_parameter_counts(name):
  shapes = abstract_params(mixer(num_classes=1000, **MIXER_VARIANTS[name]), 224)
  count = sum(leaf.size for leaf in jax.tree.leaves(shapes))
  assert count == GOLDEN_PARAM_COUNTS[name]
  assert count == closed_form_count(**MIXER_VARIANTS[name])


def test_parameter_names_are_the_released_mixers():
  shapes = abstract_params(mixer(num_classes=10, **TINY), 16)
  names = set(flax.traverse_util.flatten_dict(shapes, sep="/"))
  block = {
      f"{module}/{p}" for module in ("LayerNorm_0", "LayerNorm_1")
      for p in ("scale", "bias")
  } | {
      f"{mlp}/Dense_{i}/{p}" for mlp in ("token_mixing", "channel_mixing")
      for i in (0, 1) for p in ("kernel", "bias")
  }
  assert names == ({"stem/kernel", "stem/bias"} |
                   {f"MixerBlock_{i}/{n}" for i in range(2) for n in block} | {
                       f"{m}/{p}" for m in ("pre_head_layer_norm", "head")
                       for p in ("bias", "scale" if m != "head" else "kernel")
                   })


def random_params(model, size, seed=0):
  params = numpy_reference.trained_like_params(abstract_params(model, size),
                                               seed)
  kernel = params["stem"]["kernel"]  # A patch embedding, not a conv stem.
  params["stem"]["kernel"] = (
      np.random.default_rng(seed).normal(size=kernel.shape) /
      np.sqrt(np.prod(kernel.shape[:-1]))).astype(np.float32)
  return params


@pytest.mark.parametrize("approximate", [True, False])
def test_one_block_matches_the_papers_equation(approximate):
  block = MixerBlock(tokens_mlp_dim=5, channels_mlp_dim=24,
                     form=models.ModelForm(gelu_approximate=approximate))
  x = np.random.default_rng(4).normal(size=(2, 9, 8)).astype(np.float32)
  shapes = jax.eval_shape(lambda: block.init(jax.random.key(0), x, True))
  params = numpy_reference.trained_like_params(shapes["params"], seed=4)
  y = block.apply({"params": params}, x, True)
  gelu = numpy_reference.gelu_tanh if approximate else numpy_reference.gelu_erf
  np.testing.assert_allclose(y, numpy_mixer.mixer_block(x, params, gelu),
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("approximate", [True, False])
@pytest.mark.parametrize("representation_size", [None, 12])
def test_matches_an_independent_float64_forward(approximate,
                                                representation_size):
  model = mixer(num_classes=10, representation_size=representation_size,
                gelu_approximate=approximate, **TINY)
  params = random_params(model, 16)
  x = np.random.default_rng(1).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  logits, out = model.apply({"params": params}, x, return_intermediates=True)
  gelu = numpy_reference.gelu_tanh if approximate else numpy_reference.gelu_erf
  want, pre_logits, blocks = numpy_mixer.mixer(params, x, 4, gelu)
  assert out["grid"] == (4, 4)
  np.testing.assert_allclose(out["blocks"], blocks, atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(out["pre_logits"], pre_logits, atol=2e-5)
  np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
  # The two GELU forms differ well beyond that tolerance here.
  other = (numpy_reference.gelu_erf
           if approximate else numpy_reference.gelu_tanh)
  assert np.abs(numpy_mixer.mixer(params, x, 4, other)[0] - want).max() > 1e-4


def test_outputs_without_a_head_and_with_changed_patch_embeddings():
  model = mixer(num_classes=None, **TINY)
  params = random_params(mixer(num_classes=10, **TINY), 16)
  del params["head"]
  x = np.random.default_rng(2).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  features, out = model.apply({"params": params}, x)
  assert "logits" not in out and features.shape == (2, 16)
  np.testing.assert_allclose(out["head_input"], out["encoded"].mean(axis=1),
                             rtol=1e-6)
  assert out["patch_tokens"].shape == (2, 16, 16)
  zeroed, _ = model.apply({"params": params}, x,
                          patch_embeddings_fn=jnp.zeros_like)
  # Zero embeddings are what a zero image with a zero stem bias gives.
  params["stem"]["bias"] = np.zeros_like(params["stem"]["bias"])
  want = numpy_mixer.mixer(params, np.zeros_like(x), 4)[1]
  np.testing.assert_allclose(zeroed, want, atol=2e-5)


def test_remat_stochastic_depth_and_bfloat16():
  x = np.random.default_rng(3).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  params = random_params(mixer(num_classes=10, **TINY), 16)
  plain = mixer(num_classes=10, **TINY).apply({"params": params}, x)[0]
  for remat in ("full", "dots"):
    model = mixer(num_classes=10, remat=remat, **TINY)
    np.testing.assert_allclose(
        model.apply({"params": params}, x)[0], plain, atol=1e-6)
  dropped = mixer(num_classes=10, drop_path_rate=0.5, **TINY)
  assert np.array_equal(dropped.apply({"params": params}, x)[0], plain)
  trained = dropped.apply({"params": params}, x, train=True,
                          rngs={"dropout": jax.random.key(0)})[0]
  assert not np.allclose(trained, plain)
  low = mixer(num_classes=10, dtype=jnp.bfloat16, **TINY)
  logits, out = low.apply({"params": params}, x)
  assert logits.dtype == jnp.float32 and out["encoded"].dtype == jnp.bfloat16
  assert np.abs(logits - plain).max() < 0.1 * np.abs(plain).max()


def test_timm_weights_give_timm_logits():
  """timm's own state dict and logits (tests/references: timm computed
  them), through from_timm_mixer, with timm's exact-erf GELU."""
  from safetensors import numpy as st_numpy
  state = st_numpy.load_file(stored.path("tiny_mixer.safetensors"))
  flat = weights.from_timm_mixer(state)
  arch = weights.mixer_architecture(flat)
  assert arch == weights.MixerArchitecture(
      hidden_size=32, tokens_mlp_dim=16, channels_mlp_dim=128, num_layers=2,
      patch_size=8, num_tokens=16, num_classes=10, representation_size=None)
  assert arch.image_size == stored.TINY_IMAGE_SIZE
  model = mixer(num_classes=10, gelu_approximate=False, **TIMM_LIKE)
  params = flax.traverse_util.unflatten_dict(flat, sep="/")
  want = jax.tree.map(np.shape, abstract_params(model, 32))
  assert jax.tree.map(np.shape, params) == want
  logits = model.apply({"params": params}, stored.tiny_images())[0]
  error = np.abs(np.asarray(logits) - stored.tiny_mixer_logits()).max()
  assert error < 1e-5, error
  tanh = mixer(num_classes=10, **TIMM_LIKE)  # The released weights' GELU.
  tanh_logits = tanh.apply({"params": params}, stored.tiny_images())[0]
  assert np.abs(tanh_logits - stored.tiny_mixer_logits()).max() > 1e-4


def test_timm_layout_round_trips_exactly():
  from safetensors import numpy as st_numpy
  state = st_numpy.load_file(stored.path("tiny_mixer.safetensors"))
  assert weights.is_mixer(state)
  back = weights.to_timm_mixer(weights.from_timm_mixer(state))
  assert sorted(back) == sorted(state)
  for name, value in state.items():
    assert back[name].dtype == value.dtype and back[name].flags.c_contiguous
    np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_unknown_or_misshapen_parameters_are_refused_by_name():
  flat = flax.traverse_util.flatten_dict(
      random_params(mixer(num_classes=10, representation_size=12, **TINY), 16),
      sep="/")
  assert weights.is_mixer(flat)
  assert not weights.is_mixer(["Transformer/encoderblock_0/x"])
  assert weights.mixer_architecture(flat).representation_size == 12
  with pytest.raises(
      WeightsError, match=r"^pre_logits/bias, pre_logits/kernel "
      r"have no counterpart in timm's MlpMixer"):
    weights.to_timm_mixer(flat)
  with pytest.raises(WeightsError, match=r"stem\.norm\.weight has no "
                     "counterpart"):
    weights.from_timm_mixer({"stem.norm.weight": np.ones(4)})
  with pytest.raises(WeightsError, match=r"head\.weight has shape \(4,\)"):
    weights.from_timm_mixer({"head.weight": np.ones(4)})
  del flat["MixerBlock_1/LayerNorm_0/scale"]
  del flat["MixerBlock_0/token_mixing/Dense_0/kernel"]
  with pytest.raises(WeightsError, match="no MixerBlock_0/token_mixing"):
    weights.mixer_architecture(flat)
  flat = {k: v for k, v in flat.items() if not k.startswith("MixerBlock_0/")}
  with pytest.raises(WeightsError, match=r"MixerBlock_0\.\.N-1"):
    weights.mixer_architecture(flat)
