r"""How far the attention implementations are from the explicit one.

    python benchmarks/attention_parity.py --variant=ViT-B/16 --dtype=bfloat16

One batch of random images through the model with `config.model.attention`
set to each implementation the backend has (`xla` everywhere, `cudnn` on
NVIDIA GPUs in bf16/fp16), the same parameters: the largest difference of
the logits from `explicit`, and the L2 norm of the gradients' difference
relative to the explicit gradients' norm. Prints JSON; needs no TensorFlow.
"""

import argparse
import json

import jax
import jax.numpy as jnp
import optax

from vit_jax import models


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--variant", default="ViT-Ti/16")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--image_size", type=int, default=224)
  args = parser.parse_args()
  images = jax.random.uniform(jax.random.key(1),
                              (args.batch, args.image_size, args.image_size, 3),
                              minval=-1, maxval=1)
  labels = jax.nn.one_hot(jnp.arange(args.batch) % 10, 10)

  def run(attention, params=None):
    model = models.create_model(args.variant, 10, dtype=args.dtype,
                                attention=attention)
    if params is None:
      params = model.init(jax.random.key(0), images)["params"]
      # A non-zero head, so gradients reach every layer.
      params["head"]["kernel"] = 0.02 * jax.random.normal(
          jax.random.key(2), params["head"]["kernel"].shape)

    def loss(p):
      logits, _ = model.apply({"params": p}, images)
      return optax.softmax_cross_entropy(logits.astype(jnp.float32),
                                         labels).mean(), logits

    (value, logits), grads = jax.jit(jax.value_and_grad(loss,
                                                        has_aux=True))(params)
    return params, logits.astype(jnp.float32), grads

  params, logits, grads = run("explicit")
  others = ["xla"] + (["cudnn"] if jax.default_backend() == "gpu" and
                      args.dtype != "float32" else [])
  result = {
      "backend": jax.default_backend(),
      "variant": args.variant,
      "dtype": args.dtype
  }
  for name in others:
    _, other_logits, other_grads = run(name, params)
    grad_diff = float(
        optax.global_norm(jax.tree.map(jnp.subtract, grads, other_grads)) /
        optax.global_norm(grads))
    result[name] = {
        "logits_max_abs_diff": float(jnp.max(jnp.abs(logits - other_logits))),
        "logits_max_abs": float(jnp.max(jnp.abs(logits))),
        "grads_relative_l2_diff": grad_diff
    }
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
