"""Tests of the ViT model: a numpy reference, properties, bad input (the named
variants' sizes and names are in `test_variants.py`).

Everything that runs uses tiny models so the file stays fast on a laptop CPU.
The numpy reference (`tests/helpers/numpy_reference.py`) is written from the
paper's
equations and the released code's formulas and never calls `vit_jax`, so it
checks the model rather than restating it.
"""

import functools
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.helpers import numpy_reference as ref
from tests.helpers import tiny_models
from tests.test_variants import flat
from tests.test_variants import variant_model
from vit_jax import models
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.models import VARIANTS
from vit_jax.models import attention
from vit_jax.models import scan

# The tiny model that every numerical test runs.
TINY = dict(num_classes=7, hidden_size=32, mlp_dim=64, num_heads=4,
            num_layers=2, patch_size=4)
IMAGE_SHAPE = (4, 16, 16, 3)  # A 4x4 grid of 4x4 patches.
B = IMAGE_SHAPE[0]

# ----------------------------------------------------------------- helpers --


def tiny_model(**kwargs) -> models.VisionTransformer:
  return tiny_models.vit(**{**TINY, **kwargs})


def images(seed: int = 0, shape=IMAGE_SHAPE) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def random_params(model, x=None, seed: int = 1, scale: float = 0.3):
  """Params of `model` (structure from flax init) filled with noise.

  Every leaf is randomised, the zero-initialised head and cls token and the
  LayerNorm biases included (LayerNorm scales as 1 + noise), so no test passes
  because a weight happens to be 0 or 1. The init is only traced: compiling
  the random initialisers would dominate the run time of this file.
  """
  x = images() if x is None else x
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    base = 1.0 if path[-1].key == "scale" else 0.0
    noise = rng.normal(size=leaf.shape)
    return jnp.asarray(base + scale * noise, leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, shapes)


@functools.partial(jax.jit,
                   static_argnames=("model", "train", "return_intermediates"))
def run(model, params, x, rngs=None, train=False, return_intermediates=False):
  """Jitted `model.apply`."""
  return model.apply({"params": params}, x, rngs=rngs, train=train,
                     return_intermediates=return_intermediates)


# -------------------------------------------------------- numpy reference --


def trained_like(model, x, seed=1):
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
  return ref.trained_like_params(shapes, seed)


@pytest.mark.parametrize(
    "classifier,representation_size,class_token,posemb",
    [
        ("token", 24, None, "learn"),
        ("gap", None, None, "learn"),
        # big_vision's plain ViTs: sin-cos position embeddings, no class
        # token, GAP or MAP, a pre-logits layer of any width.
        ("gap", 40, None, "sincos2d"),
        ("map", None, None, "sincos2d"),
        ("map", None, None, "learn"),  # SigLIP's image towers.
        ("token", None, None, "sincos2d"),
        # A class token beside GAP or MAP pooling of the patches.
        ("gap", None, True, "learn"),
        ("map", 16, True, "sincos2d"),
    ])
def test_forward_matches_numpy_reference(classifier, representation_size,
                                         class_token, posemb):
  model = tiny_model(classifier=classifier,
                     representation_size=representation_size,
                     class_token=class_token, posemb=posemb)
  x = images()
  params = trained_like(model, x)
  assert ("pre_logits" in params) == (representation_size is not None)
  assert ("cls" in params) == (classifier == "token" or bool(class_token))
  assert ("posembed_input" in params["Transformer"]) == (posemb == "learn")
  logits, out = run(model, params, x)
  want_logits, want_pre_logits = ref.vit(params, x, TINY["patch_size"],
                                         classifier, class_token=class_token,
                                         posemb=posemb)
  assert logits.shape == (B, 7)
  assert np.abs(want_logits).max() > 0.5  # Not trivially zero.
  np.testing.assert_allclose(out["pre_logits"], want_pre_logits, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)


def test_gelu_is_the_released_tanh_form_and_erf_is_an_option():
  """The reference can tell the two forms apart at these weight scales."""
  x = images()
  tanh_model, erf_model = tiny_model(), tiny_model(gelu_approximate=False)
  params = trained_like(tanh_model, x)
  want_tanh, _ = ref.vit(params, x, TINY["patch_size"])
  want_erf, _ = ref.vit(params, x, TINY["patch_size"], gelu=ref.gelu_erf)
  assert np.abs(want_tanh - want_erf).max() > 1e-4  # 10x the tolerance.
  np.testing.assert_allclose(
      run(tanh_model, params, x)[0], want_tanh, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      run(erf_model, params, x)[0], want_erf, rtol=1e-5, atol=1e-5)


def test_hybrid_matches_numpy_reference_with_released_standardisation():
  """Conv kernels at trained scales (std 0.01-0.05), where (std + 1e-5)
  and sqrt(var + 1e-5) differ by up to 5%: only the released form passes."""
  model = variant_model("testing-hybrid", num_classes=5)
  x = images(shape=(2, 32, 32, 3))
  params = trained_like(model, x)
  logits, _ = run(model, params, x)
  want, _ = ref.vit(params, x, VARIANTS["testing-hybrid"].patch_size)
  assert np.abs(want).max() > 0.5
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)

  def variance_eps(kernel, eps=1e-5):
    w = kernel - kernel.mean(axis=(0, 1, 2))
    return w / np.sqrt(w.var(axis=(0, 1, 2)) + eps)

  other, _ = ref.vit(params, x, VARIANTS["testing-hybrid"].patch_size,
                     standardize_fn=variance_eps)
  assert np.abs(other - want).max() > 1e-3


# -------------------------------------------------------------- properties --


def test_without_posemb_permuting_patches_permutes_tokens():
  model = tiny_model(posemb="none", classifier="gap")
  x = images()
  params = random_params(model, x)
  assert "posembed_input" not in params["Transformer"]
  perm = np.random.default_rng(3).permutation(16)

  b, p = x.shape[0], TINY["patch_size"]
  blocks = x.reshape(b, 4, p, 4, p, 3).transpose(0, 1, 3, 2, 4, 5)
  blocks = blocks.reshape(b, 16, p, p, 3)[:, perm]
  x_perm = blocks.reshape(b, 4, 4, p, p, 3).transpose(0, 1, 3, 2, 4, 5)
  x_perm = x_perm.reshape(x.shape)

  _, out = run(model, params, x)
  _, out_perm = run(model, params, x_perm)
  np.testing.assert_allclose(out_perm["encoded"], out["encoded"][:, perm],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out_perm["logits"], out["logits"], rtol=1e-5,
                             atol=1e-5)


def test_batch_elements_are_independent():
  model = tiny_model()
  x = images()
  params = random_params(model, x)
  logits = run(model, params, x)[0]
  for i in range(B):
    np.testing.assert_allclose(logits[i],
                               run(model, params, x[i:i + 1])[0][0], rtol=1e-5,
                               atol=1e-5)

  loss_of_first = lambda x: jnp.sum(run(model, params, x)[0][0]**2)
  grad = np.asarray(jax.jit(jax.grad(loss_of_first))(x))
  assert np.abs(grad[0]).max() > 0
  assert np.all(grad[1:] == 0)


def test_bf16_compute_keeps_fp32_params_and_logits():
  model_bf16 = tiny_model(dtype=jnp.bfloat16)
  x = images()
  params = random_params(model_bf16, x)  # Dtypes as flax init makes them.
  assert {a.dtype for a in jax.tree.leaves(params)} == {jnp.dtype("float32")}

  logits_bf16, out = run(model_bf16, params, x)
  logits_fp32, _ = run(tiny_model(), params, x)
  assert logits_bf16.dtype == jnp.float32
  assert out["pre_logits"].dtype == jnp.float32
  assert out["encoded"].dtype == jnp.bfloat16  # bf16 really is used.
  assert np.all(np.isfinite(logits_bf16))
  scale = np.abs(logits_fp32).max()
  assert np.abs(logits_bf16 - logits_fp32).max() / scale < 5e-2


def test_stack_unstack_layers_round_trip_exactly():
  params = random_params(tiny_model())
  stacked = scan.stack_layers(params)
  assert scan.is_scanned(stacked) and not scan.is_scanned(params)
  assert stacked["Transformer"]["encoderblock"]["LayerNorm_0"][
      "scale"].shape == (TINY["num_layers"], TINY["hidden_size"])
  back = flat(scan.unstack_layers(stacked))
  want = flat(params)
  assert back.keys() == want.keys()
  for k in want:
    assert back[k].dtype == want[k].dtype, k
    np.testing.assert_array_equal(back[k], want[k], err_msg=k)


def test_stack_layers_rejects_missing_block():
  params = random_params(tiny_model())
  del params["Transformer"]["encoderblock_0"]
  with pytest.raises(ValueError, match="encoderblock"):
    scan.stack_layers(params)


def test_scan_layers_matches_loop_with_converted_params():
  x = images()
  params = random_params(tiny_model(), x)
  scan_model = tiny_model(scan_layers=True)
  # The converted tree has exactly the structure that scan init creates.
  scan_init = jax.eval_shape(scan_model.init, jax.random.key(0), x)["params"]
  stacked = scan.stack_layers(params)
  assert (jax.tree.map(lambda a: a.shape, scan_init) == jax.tree.map(
      lambda a: a.shape, stacked))

  logits, out = run(tiny_model(), params, x)
  logits_scan, out_scan = run(scan_model, stacked, x)
  np.testing.assert_allclose(out_scan["encoded"], out["encoded"], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(logits_scan, logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("remat,scan_layers", [("full", False), ("dots", True)])
def test_remat_gives_same_outputs_and_gradients(remat, scan_layers):
  x = images()
  params = random_params(tiny_model(), x)
  if scan_layers:
    params = scan.stack_layers(params)
  plain = tiny_model(scan_layers=scan_layers)
  rematted = tiny_model(scan_layers=scan_layers, remat=remat)

  def loss_and_grad(model):
    loss = lambda p: jnp.sum(jnp.sin(run(model, p, x, train=True)[0]))
    return jax.jit(jax.value_and_grad(loss))(params)

  want_loss, want_grads = loss_and_grad(plain)
  loss, grads = loss_and_grad(rematted)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  want, got = flat(want_grads), flat(grads)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_return_intermediates(scan_layers):
  x = images()
  params = random_params(tiny_model(), x)
  if scan_layers:
    params = scan.stack_layers(params)
  _, out = run(tiny_model(scan_layers=scan_layers), params, x,
               return_intermediates=True)
  num_layers, heads, width = (TINY["num_layers"], TINY["num_heads"],
                              TINY["hidden_size"])
  assert out["blocks"].shape == (num_layers, B, 17, width)
  assert out["attention_weights"].shape == (num_layers, B, heads, 17, 17)
  np.testing.assert_allclose(out["attention_weights"].sum(-1), 1.0, rtol=1e-5)
  assert np.all(out["attention_weights"] >= 0)
  assert not np.allclose(out["blocks"][-1], out["encoded"], atol=1e-3)
  # The encoder output is the final LayerNorm of the last block's output.
  norm = jax.tree.map(np.asarray, params["Transformer"]["encoder_norm"])
  np.testing.assert_allclose(
      ref.layer_norm(np.asarray(out["blocks"][-1]), norm), out["encoded"],
      rtol=1e-4, atol=1e-4)

  _, plain_out = run(tiny_model(scan_layers=scan_layers), params, x)
  assert "blocks" not in plain_out and "attention_weights" not in plain_out


def test_return_intermediates_keyword_reaches_call():
  """Regression: the flag once shared its name with a `Module.apply` keyword,
  which swallowed it."""
  model = tiny_model()
  x = images()
  variables = {"params": random_params(model, x)}
  result = jax.eval_shape(
      lambda v, x: model.apply(v, x, return_intermediates=True), variables, x)
  assert isinstance(result[1], dict) and "blocks" in result[1]


def test_call_keywords_do_not_collide_with_module_apply():
  """`apply` keeps keywords named like its own parameters from `__call__`."""
  call = set(inspect.signature(models.VisionTransformer.__call__).parameters)
  apply = set(inspect.signature(nn.Module.apply).parameters)
  assert call & apply == {"self"}


def test_tiny_hybrid_token_grid_follows_variant_stride():
  variant = VARIANTS["testing-hybrid"]
  stride = variant.stride
  assert stride == 8  # Root /4, then one strided stage.
  model = variant_model("testing-hybrid", num_classes=5)
  x = images(shape=(2, 32, 48, 3))  # Not square, to catch H/W mix-ups.
  params = random_params(model, x)
  logits, out = run(model, params, x)
  grid = (32 // stride, 48 // stride)
  num_tokens = grid[0] * grid[1] + 1
  assert out["grid"] == grid
  assert out["stem"].shape[:3] == (2,) + grid
  assert out["encoded"].shape == (2, num_tokens, variant.hidden_size)
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (
      1, num_tokens, variant.hidden_size)
  assert logits.shape == (2, 5) and np.all(np.isfinite(logits))


def test_map_head():
  model = tiny_model(classifier="map")
  x = images()
  params = random_params(model, x)
  assert params["MAPHead_0"]["probe"].shape == (1, 1, TINY["hidden_size"])
  assert "cls" not in params
  logits, out = run(model, params, x)
  assert logits.shape == (B, 7) and np.all(np.isfinite(logits))
  assert out["head_input"].shape == (B, TINY["hidden_size"])


def test_dropout_only_in_training():
  model = tiny_model(dropout_rate=0.1, attention_dropout_rate=0.1)
  x = images()
  params = random_params(model, x)
  eval_1 = run(model, params, x)[0]
  eval_2 = run(model, params, x)[0]
  np.testing.assert_array_equal(eval_1, eval_2)
  rngs = lambda seed: {"dropout": jax.random.key(seed)}
  train_1 = run(model, params, x, train=True, rngs=rngs(0))[0]
  train_2 = run(model, params, x, train=True, rngs=rngs(1))[0]
  assert not np.allclose(train_1, eval_1, atol=1e-4)
  assert not np.allclose(train_1, train_2, atol=1e-4)
  np.testing.assert_array_equal(
      train_1,
      run(model, params, x, train=True, rngs=rngs(0))[0])


# --------------------------------------------------------------- bad input --


def test_image_not_divisible_by_patch_size():
  with pytest.raises(ValueError, match="not divisible by the patch size"):
    tiny_model().init(jax.random.key(0), images(shape=(1, 18, 18, 3)))


def test_unknown_variant_lists_known_ones():
  with pytest.raises(ValueError, match="ViT-X/99") as info:
    models.get_variant("ViT-X/99")
  for name in VARIANTS:
    assert name in str(info.value)


def model_config(**overrides) -> ml_collections.ConfigDict:
  config = defaults.get_model_config()
  config.update(variant="testing", **overrides)
  return config


def test_check_model_config_accepts_good_config():
  models.check_model_config(model_config())


@pytest.mark.parametrize("field,value", [("classifier", "cls"),
                                         ("remat", "some"), ("dtype", "fp32")])
def test_check_model_config_names_bad_field(field, value):
  with pytest.raises(ValueError, match=field):
    models.check_model_config(model_config(**{field: value}))


@pytest.mark.parametrize("change, message", [
    (dict(rope="axial", rope_temperature=0.0),
     "config.model.rope_temperature=0.0 must be positive"),
    (dict(rope="mixed", rope_temperature=-10.0),
     "config.model.rope_temperature=-10.0 must be positive"),
    (dict(rope="dinov3", rope_jitter=0.5),
     "config.model.rope_jitter=0.5 must be 1 (none) or more"),
    (dict(rope="dinov3", rope_rescale=float("nan")),
     "config.model.rope_rescale=nan must be 1 (none) or more"),
    (dict(rope="dinov3", rope_shift=-0.1),
     "config.model.rope_shift=-0.1 must be 0 (none) or more"),
    (dict(rope="axial", rope_grid_offset=float("inf")),
     "config.model.rope_grid_offset=inf must be a finite number"),
    (dict(rope="axial", rope_reference_grid=-2),
     "config.model.rope_reference_grid=-2 must be 0 (none)"),
    (dict(classifier="gap", map_heads=4),
     "config.model.map_heads=4 sets the heads of a MAP head, and "
     "classifier=gap has none"),
])
def test_rope_numbers_out_of_range_and_stray_map_heads_are_refused(
    change, message):
  """Each in one line naming the field and its value, before tracing (a
  RoPE base of 0 made every angle inf: training diverged at step 5); the
  same values in range are accepted."""
  with pytest.raises(UserError) as refused:
    models.check_model_config(model_config(**change))
  assert str(refused.value).startswith(message), str(refused.value)
  models.check_model_config(
      model_config(rope="axial", rope_temperature=0.5, rope_grid_offset=-1.0,
                   rope_reference_grid=3, rope_shift=0.5, rope_jitter=1.0,
                   rope_rescale=2.0, classifier="map", map_heads=4))


# ------------------------------------------------------------ attention --


def _attention_model(attention):
  return tiny_models.vit(**{**TINY, "patch_size": 4}, attention=attention)


def test_fused_attention_paths_equal_the_explicit_one():
  """`auto` is the explicit form on CPU, bit for bit; `xla` computes the
  same attention in another order (about 1e-6 relative in fp32)."""
  x = jax.random.normal(jax.random.key(1), (3, 16, 16, 3))
  explicit = _attention_model("explicit")
  params = jax.jit(explicit.init)(jax.random.key(0), x)["params"]
  params["head"]["kernel"] = jax.random.normal(jax.random.key(2),
                                               params["head"]["kernel"].shape)

  def logits_and_grads(attention):
    model = _attention_model(attention)
    loss = lambda p: jnp.sum(model.apply({"params": p}, x)[0]**2)
    return model.apply({"params": params}, x)[0], jax.grad(loss)(params)

  want, want_grads = logits_and_grads("explicit")
  got, grads = logits_and_grads("auto")
  np.testing.assert_array_equal(got, want)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_array_equal(a, b)
  got, grads = logits_and_grads("xla")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  flat = lambda g: np.concatenate([np.ravel(a) for a in jax.tree.leaves(g)])
  difference = flat(grads) - flat(want_grads)
  assert np.linalg.norm(difference) < 1e-5 * np.linalg.norm(flat(want_grads))


def test_padded_attention_masks_its_padding():
  """cuDNN needs an even token count; the padded, masked form gives the
  unpadded answer (checked here with the xla implementation)."""
  q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 17, 4, 8))
  plain = jax.nn.dot_product_attention(q, k, v, scale=1.0)
  for multiple in (2, 8):
    padded = attention.fused_attention(q, k, v, "xla", multiple)
    assert padded.shape == plain.shape
    np.testing.assert_allclose(padded, plain, rtol=1e-5, atol=1e-6)


def test_attention_weights_only_where_asked():
  x = jnp.ones((2, 5, 8))
  layer = attention.MultiHeadDotProductAttention(
      num_heads=2, form=models.ModelForm(attention="xla"))
  params = layer.init(jax.random.key(0), x, x, True)
  out, weights = layer.apply(params, x, x, True)
  assert weights is None
  out_with, weights = layer.apply(params, x, x, True, need_weights=True)
  assert weights.shape == (2, 2, 5, 5)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(out, out_with, rtol=1e-6, atol=1e-6)


def test_an_unknown_attention_is_refused():
  config = model_config(attention="flash")
  with pytest.raises(UserError, match="config.model.attention='flash'"):
    models.check_model_config(config)
