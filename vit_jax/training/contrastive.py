"""SigLIP's and CLIP's losses; SigLIP's on a device ring, in (B/N)^2 memory.

SigLIP's loss is chunked as its paper does it (Zhai et al. 2023, "Sigmoid
Loss for Language Image Pre-Training", section 3.3): each device scores its
own images against one device's texts at a time, the texts passed around the
ring of the N devices that split the batch, so its memory grows with
(B/N)^2, not B^2 (nor B^2/N). Its gradient goes around the ring again
rather than keeping every chunk the forward pass saw. Embeddings are
L2-normalised; the losses are computed in float32. An example of `mask` 0
(an unreadable image's placeholder) is in no pair, positive or negative,
and the batch's size is its real examples'. Imports no TensorFlow.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vit_jax import sharding


def _sigmoid_nll(zimg_CxD, ztxt_KxD, t, b, wimg_C, wtxt_K, positives: bool):
  """The sum over all pairs of -log sigmoid(label * logit), labels +1 on the
  diagonal (with `positives`: the texts are the images' own) and -1 off it,
  each pair weighted by its image's and its text's weight (0 or 1)."""
  logits_CxK = t * (zimg_CxD @ ztxt_KxD.T) + b
  signs = 2 * jnp.eye(*logits_CxK.shape) - 1 if positives else -1.0
  pairs_CxK = wimg_C[:, None] * wtxt_K[None, :]
  return -jnp.sum(pairs_CxK * jax.nn.log_sigmoid(signs * logits_CxK))


def _ring(n: int) -> list[tuple[int, int]]:
  return [(i, (i + 1) % n) for i in range(n)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _ring_nll(zimg_CxD, ztxt_CxD, t, b, w_C, wtxt_C, axes, n):
  """`_sigmoid_nll` of this device's images against every device's texts,
  passed (with their weights) n - 1 times to the next of the n devices
  along `axes`; `w_C` weighs this device's images, `wtxt_C` its texts."""
  nll = _sigmoid_nll(zimg_CxD, ztxt_CxD, t, b, w_C, wtxt_C, positives=True)

  def step(_, carry):
    nll, texts = carry
    texts = jax.lax.ppermute(texts, axes, _ring(n))
    return nll + _sigmoid_nll(zimg_CxD, *texts[:1], t, b, w_C, texts[1],
                              False), texts

  return jax.lax.fori_loop(1, n, step, (nll, (ztxt_CxD, wtxt_C)))[0]


def _ring_nll_fwd(zimg_CxD, ztxt_CxD, t, b, w_C, wtxt_C, axes, n):
  residuals = (zimg_CxD, ztxt_CxD, t, b, w_C, wtxt_C)
  return _ring_nll(*residuals, axes, n), residuals


def _ring_nll_bwd(axes, n, residuals, g):
  """The ring again, each text chunk's gradient travelling with it (home
  after n hops). Autodiff would keep all n chunks received: B x D. The
  weights get no gradient."""
  zimg_CxD, ztxt_CxD, t, b, w_C, wtxt_C = residuals

  def grads(ztxt_CxD, wtxt_C, positives):
    nll = lambda zi, zt, t, b: _sigmoid_nll(zi, zt, t, b, w_C, wtxt_C, positives
                                           )
    return jax.vjp(nll, zimg_CxD, ztxt_CxD, t, b)[1](g)

  def step(_, carry):
    (ztxt_CxD, wtxt_C), (dimg, dtxt, dt, db) = carry
    ztxt_CxD, wtxt_C, dtxt = jax.lax.ppermute((ztxt_CxD, wtxt_C, dtxt), axes,
                                              _ring(n))
    sums = jax.tree.map(jnp.add, (dimg, dtxt, dt, db),
                        grads(ztxt_CxD, wtxt_C, False))
    return (ztxt_CxD, wtxt_C), sums

  init = ((ztxt_CxD, wtxt_C), grads(ztxt_CxD, wtxt_C, True))
  dimg, dtxt, dt, db = jax.lax.fori_loop(1, n, step, init)[1]
  return (dimg, jax.lax.ppermute(dtxt, axes, _ring(n)), dt, db,
          jnp.zeros_like(w_C), jnp.zeros_like(wtxt_C))


_ring_nll.defvjp(_ring_nll_fwd, _ring_nll_bwd)


def _f32(*arrays):
  return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def _on_batch_shards(fn, mesh: Mesh, axes: tuple[str, ...], whole: int):
  """`fn(zimg_CxD, ztxt_CxD, mask_C, ...)` on each device's rows of the
  embeddings and the mask and `whole` more arguments whole, manual over
  `axes` only (a `model` axis stays automatic)."""
  in_specs = (P(axes), P(axes), P(axes)) + (P(),) * whole
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P(),
                       axis_names=set(axes))


def _batch_axes(mesh: Mesh, batch_axes) -> tuple[tuple[str, ...], int]:
  """The batch axes as a tuple, and N, the number of batch shards."""
  axes = sharding.batch_axes(mesh) if batch_axes is None else batch_axes
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return axes, math.prod(mesh.shape[a] for a in axes)


def _real(mask_B, batch: int):
  """(the examples' weights, their count: at least 1)."""
  if mask_B is None:
    return jnp.ones((batch,), jnp.float32), float(batch)
  mask_B = jnp.asarray(mask_B, jnp.float32)
  return mask_B, jnp.maximum(jnp.sum(mask_B), 1.0)


def sigmoid_loss(zimg_BxD, ztxt_BxD, t, b, mesh: Mesh | None = None,
                 batch_axes=None, chunked: bool = True,
                 mask_B=None) -> jax.Array:
  """SigLIP's loss: -sum of log sigmoid(label * (t zimg.ztxt + b)) over all
  B x B pairs (label +1 for an example's own image and text, -1 otherwise),
  divided by B, as big_vision's trainer computes it; with `mask_B`, over
  the pairs of real examples, divided by their count.

  With a `mesh` and `chunked`, the ring over the devices of `batch_axes`
  (default `sharding.batch_axes(mesh)`); without, the whole B x B logits.
  """
  zimg_BxD, ztxt_BxD, t, b = _f32(zimg_BxD, ztxt_BxD, t, b)
  w_B, count = _real(mask_B, zimg_BxD.shape[0])
  if mesh is None or not chunked:
    return _sigmoid_nll(zimg_BxD, ztxt_BxD, t, b, w_B, w_B,
                        positives=True) / count
  axes, n = _batch_axes(mesh, batch_axes)

  def on_shard(zimg_CxD, ztxt_CxD, w_C, t, b):
    # Varying like the chunks, so `_ring_nll_bwd` may return their
    # per-device gradients; the shard_map then sums them.
    t, b = (jax.lax.pcast(x, axes, to="varying") for x in (t, b))
    nll = _ring_nll(zimg_CxD, ztxt_CxD, t, b, w_C, w_C, axes, n)
    return jax.lax.psum(nll, axes)

  on_shards = _on_batch_shards(on_shard, mesh, axes, whole=2)
  return on_shards(zimg_BxD, ztxt_BxD, w_B, t, b) / count


def _softmax_nll(q_CxD, k_BxD, t, labels_C, wq_C, wk_B):
  """The sum over q's rows (weighted by `wq_C`) of the cross-entropy of
  softmax(t q.k) over the k of weight 1 against the row's label."""
  logits_CxB = jnp.where(wk_B[None, :] > 0, t * (q_CxD @ k_BxD.T), _NEVER)
  own_C = jnp.take_along_axis(logits_CxB, labels_C[:, None], axis=1)[:, 0]
  return jnp.sum(wq_C * (jax.nn.logsumexp(logits_CxB, axis=1) - own_C))


_NEVER = -1e9  # A logit no softmax gives weight to (finite: no NaN).


def softmax_loss(zimg_BxD, ztxt_BxD, t, mesh: Mesh | None = None,
                 batch_axes=None, mask_B=None) -> jax.Array:
  """CLIP's loss: the mean of the cross-entropies of each image over the
  texts and of each text over the images (logits t zimg.ztxt), each the
  mean over the batch.

  With a `mesh`, each device gathers all embeddings and scores its own
  images and texts against them: C x B logits (C = B/N).
  """
  zimg_BxD, ztxt_BxD, t = _f32(zimg_BxD, ztxt_BxD, t)
  batch = zimg_BxD.shape[0]
  w_B, count = _real(mask_B, batch)
  if mesh is None:
    labels_B = jnp.arange(batch)
    return (_softmax_nll(zimg_BxD, ztxt_BxD, t, labels_B, w_B, w_B) +
            _softmax_nll(ztxt_BxD, zimg_BxD, t, labels_B, w_B, w_B)) / (2 *
                                                                        count)
  axes, _ = _batch_axes(mesh, batch_axes)

  def on_shard(zimg_CxD, ztxt_CxD, w_C, t):
    chunk = zimg_CxD.shape[0]
    labels_C = jax.lax.axis_index(axes) * chunk + jnp.arange(chunk)
    gather = functools.partial(jax.lax.all_gather, axis_name=axes, tiled=True)
    w_B = gather(w_C)
    nll = (_softmax_nll(zimg_CxD, gather(ztxt_CxD), t, labels_C, w_C, w_B) +
           _softmax_nll(ztxt_CxD, gather(zimg_CxD), t, labels_C, w_C, w_B))
    return jax.lax.psum(nll, axes)

  on_shards = _on_batch_shards(on_shard, mesh, axes, whole=1)
  return on_shards(zimg_BxD, ztxt_BxD, w_B, t) / (2 * count)
