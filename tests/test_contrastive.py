"""SigLIP's and CLIP's losses (training/contrastive.py): the formulas, the
sharded forms against the whole batch (values and gradients), the
chunked sigmoid loss's per-device memory, and CLIP's bound on its
temperature."""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from configs import image_text as recipes
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax.training import contrastive
from vit_jax.training import steps
from vit_jax.training import train_state


def _embeddings(batch, dim, seed=0):
  """Two batches of L2-normalised float32 rows."""
  rows = np.random.default_rng(seed).normal(size=(2, batch, dim))
  return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(
      np.float32)


def _logsumexp(x, axis):
  top = x.max(axis=axis, keepdims=True)
  return top.squeeze(axis) + np.log(np.exp(x - top).sum(axis=axis))


def test_losses_match_a_float64_reference():
  zimg, ztxt = _embeddings(16, 8)
  t, b = np.float32(7.3), np.float32(-4.1)
  logits = t * zimg.astype(np.float64) @ ztxt.astype(np.float64).T
  labels = 2 * np.eye(16) - 1
  # -log sigmoid(x) = log(1 + e^-x).
  sigmoid = np.logaddexp(0, -labels * (logits + b)).sum() / 16
  diag = np.diag(logits)
  softmax = (np.mean(_logsumexp(logits, 1) - diag) +
             np.mean(_logsumexp(logits, 0) - diag)) / 2
  for t_, b_ in ((t, b), (np.array([t]), np.array([b]))):
    np.testing.assert_allclose(contrastive.sigmoid_loss(zimg, ztxt, t_, b_),
                               sigmoid, rtol=1e-6)
    np.testing.assert_allclose(contrastive.softmax_loss(zimg, ztxt, t_),
                               softmax, rtol=1e-6)
  # Half-precision embeddings are scored in float32.
  half = contrastive.sigmoid_loss(zimg.astype(jnp.bfloat16),
                                  ztxt.astype(jnp.bfloat16), t, b)
  assert half.dtype == jnp.float32
  np.testing.assert_allclose(half, sigmoid, rtol=2e-2)


MESHES = {
    "data=8": ((8,), ("data",), "data"),
    "slice=2,data=4": ((2, 4), ("slice", "data"), ("slice", "data")),
    "data=4,model=2": ((4, 2), ("data", "model"), "data"),
}


@pytest.mark.parametrize("shape,names,batch_axes", MESHES.values(),
                         ids=MESHES.keys())
def test_sharded_losses_and_gradients_match_the_whole_batch(
    shape, names, batch_axes):
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
  zimg, ztxt = (jax.device_put(z, NamedSharding(mesh, P(batch_axes)))
                for z in _embeddings(32, 8, seed=1))
  t, b = jnp.array([9.0]), jnp.float32(-6.0)  # (1,) and () both arrive.
  grad = lambda f, *a: jax.jit(jax.value_and_grad(f, range(len(a))))(*a)
  close = lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
  whole = grad(contrastive.sigmoid_loss, zimg, ztxt, t, b)
  for kwargs in (dict(batch_axes=batch_axes), dict(chunked=False)):
    f = lambda *a, kw=kwargs: contrastive.sigmoid_loss(*a, mesh=mesh, **kw)
    jax.tree.map(close, grad(f, zimg, ztxt, t, b), whole)
  # The default batch axes: `sharding.batch_axes(mesh)`.
  f = lambda *a: contrastive.softmax_loss(*a, mesh=mesh)
  jax.tree.map(close, grad(f, zimg, ztxt, t),
               grad(contrastive.softmax_loss, zimg, ztxt, t))
  # Placeholders (mask 0) are in no pair: the loss is the real examples'
  # alone (no gradient reaches a placeholder), on the ring and whole.
  mask = np.ones(32, np.float32)
  mask[[3, 17, 30]] = 0
  real = mask > 0
  sub = [np.asarray(z)[real] for z in (zimg, ztxt)]
  for loss, scalars in ((contrastive.sigmoid_loss, (t, b)),
                        (contrastive.softmax_loss, (t,))):
    want = grad(loss, *sub, *scalars)
    for kwargs in (dict(mesh=mesh, batch_axes=batch_axes), {}):
      f = lambda *a, loss=loss, kw=kwargs: loss(*a, mask_B=mask, **kw)
      value, grads = grad(f, zimg, ztxt, *scalars)
      close(value, want[0])
      for got, expected in zip(grads[:2], want[1][:2]):
        close(np.asarray(got)[real], expected)
        assert not np.asarray(got)[~real].any()
      jax.tree.map(close, grads[2:], want[1][2:])


def test_chunked_sigmoid_loss_keeps_a_fraction_of_the_memory():
  """B = 4,096, D = 128 on 8 devices: the whole batch's logits take 8 MiB
  per device (XLA splits their rows), a chunk's 1 MiB."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  split, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
  rows = jax.ShapeDtypeStruct((4096, 128), jnp.float32, sharding=split)
  scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=whole)
  args = (rows, rows, scalar, scalar)

  def temp_bytes(f):
    compiled = jax.jit(f).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  chunked = lambda *a: contrastive.sigmoid_loss(*a, mesh=mesh)
  for name, wrap in (("loss", lambda f: f),
                     ("value_and_grad",
                      lambda f: jax.value_and_grad(f, range(4)))):
    full_bytes = temp_bytes(wrap(contrastive.sigmoid_loss))
    chunked_bytes = temp_bytes(wrap(chunked))
    print(f"{name}: temporary bytes per device, whole batch {full_bytes:,}, "
          f"chunked {chunked_bytes:,}")
    assert chunked_bytes * 4 <= full_bytes


def _recipe(objective: str):
  recipe = {"clip": "clip", "siglip": "digits"}[objective]
  return recipes.get_config(f"{recipe},runlocal").unlock()


def _two_towers(objective: str):
  """A tiny two-tower model of `objective`'s recipe, built as training
  builds it."""
  config = _recipe(objective)
  assert config.objective == objective
  config.text.vocab_size = 16  # What `objectives.decide` reads off a
  # tokenizer.
  config.model.gelu_approximate = True
  config.model.posemb_interpolation = "bilinear"
  return objectives.model(config, None)


def _sgd_step(model, objective: str, lr: float):
  """(the model's train step under SGD at `lr`, jitted; the optimizer)."""
  tx = optax.sgd(lr)
  step = steps.make_train_step(
      model, tx,
      objectives.get(objective).loss(_recipe(objective)),
      optax.constant_schedule(lr), sharding.make_mesh(1, 1,
                                                      jax.devices()[:1]))
  return jax.jit(step), tx


def _gradient_of_t(model, params, batch, objective: str) -> float:
  """d loss / d log t, the forward reading exp(log t) as it is."""

  def loss(t):
    zimg, ztxt, out = model.apply({"params": {
        **params, "t": t
    }}, batch["image"], batch["text"])
    if objective == "clip":
      return contrastive.softmax_loss(zimg, ztxt, out["t"])
    return contrastive.sigmoid_loss(zimg, ztxt, out["t"], out["b"])

  return float(jax.grad(loss)(params["t"])[0])


def test_clips_temperature_is_clamped_after_each_update_as_openclip_does():
  """CLIP keeps log t in [0, ln 100] by clamping the parameter after the
  update (OpenCLIP's `logit_scale.clamp_(0, math.log(100))` after each
  optimizer step): from t = 100 exactly (OpenAI's released value), an SGD
  step that would raise t leaves it at ln 100, and one that would lower it
  moves it by lr times the gradient of the unclipped exp(log t) -- a clip
  inside the forward would zero that gradient and keep t at 100. SigLIP's
  t is unbounded (its paper and big_vision clip nothing)."""
  bound = np.float32(np.log(100.0))
  for objective in ("clip", "siglip"):
    model = _two_towers(objective)
    assert model.max_temperature == (100.0 if objective == "clip" else None)
    rng = np.random.default_rng(0)
    batch = {
        "image": rng.uniform(-1, 1, size=(8, 16, 16, 3)).astype(np.float32),
        "text": rng.integers(1, 16, size=(8, model.text_length), dtype=np.int32)
    }
    params = models.init_on_zeros(model, jax.random.key(0), 16)
    params = {**params, "t": jnp.full((1,), bound)}
    gradient = _gradient_of_t(model, params, batch, objective)
    assert abs(gradient) > 1e-4, objective  # Neither zero nor clipped.
    for sign in (1, -1):  # SGD down the gradient and up it, by 0.5 in log t.
      lr = sign * 0.5 / abs(gradient)
      step, tx = _sgd_step(model, objective, lr)
      state = train_state.TrainState(step=jnp.int32(0), params=params,
                                     opt_state=tx.init(params),
                                     rng=jax.random.key_data(jax.random.key(1)))
      new_t = float(step(state, batch)[0].params["t"][0])
      if objective == "clip" and -lr * gradient > 0:  # It would raise t.
        assert new_t == bound, (objective, sign)
      else:
        np.testing.assert_allclose(new_t, bound - lr * gradient, rtol=1e-5,
                                   err_msg=f"{objective} {sign}")
