"""Our Linen ViT used from Flax NNX (`flax.nnx.bridge`), as docs/extending.md
shows: it trains with `nnx.Optimizer`, and its parameters keep our names,
so what NNX trained is a checkpoint every part of the project reads."""

from flax import nnx
from flax.nnx import bridge
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax import models
from vit_jax import weights


def test_the_vit_trains_from_nnx_and_keeps_our_names(tmp_path):
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.uniform(-1, 1, (8, 16, 16, 3)), jnp.float32)
  labels = jnp.arange(8) % 10
  vit = models.create_model("testing", 10)
  model = bridge.ToNNX(vit, rngs=nnx.Rngs(0))
  bridge.lazy_init(model, images[:1], train=False)
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, images, labels):

    def loss_fn(model):
      logits, _ = model(images, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                             labels).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(train_step(model, optimizer, images, labels))]
  for _ in range(4):
    losses.append(float(train_step(model, optimizer, images, labels)))
  assert losses[-1] < losses[0] - 0.1, losses

  # The names of Linen's own tree, so the released-form file loads back.
  trained = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  linen = models.param_shapes(vit, 16)
  flat = flax.traverse_util.flatten_dict(trained, sep="/")
  assert sorted(flat) == sorted(flax.traverse_util.flatten_dict(linen, sep="/"))
  path = str(tmp_path / "from_nnx.npz")
  weights.save_npz(trained, path)
  loaded, report = weights.load(path, linen, num_prefix_tokens=1, grid=(4, 4))
  assert report.ok and len(report.matched) == len(flat)
  params = flax.traverse_util.unflatten_dict(loaded, sep="/")
  want = model(images, train=False)[0]
  got = vit.apply({"params": params}, images)[0]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert jax.tree.structure(params) == jax.tree.structure(linen)
