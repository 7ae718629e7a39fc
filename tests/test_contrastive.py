"""SigLIP's and CLIP's losses (training/contrastive.py): the formulas, the
sharded forms against the whole batch (values and gradients), and the
chunked sigmoid loss's per-device memory."""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from vit_jax.training import contrastive


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
