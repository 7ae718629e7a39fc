r"""SigLIP's sigmoid loss over the whole batch and chunked over the devices'
ring (`vit_jax/training/contrastive.py`): memory and train-step speed.

    .venv/bin/python benchmarks/image_text_loss.py --devices=8 \
        --out=/tmp/image_text_loss.json

On a mesh `data=N` of N simulated CPU devices (`--devices`):

  loss fwd, loss grad  the loss alone, and its value and gradient with
                       respect to zimg, ztxt, t and b, compiled for a global
                       batch of `--loss_batch` embeddings of `--dim`: the
                       program's temporary bytes per device
                       (`memory_analysis().temp_size_in_bytes`), the whole
                       batch's B x B logits (config.text.chunked=False)
                       against the ring's chunks (True), and their ratio
  train step           configs/image_text.py's `digits` recipe (SigLIP, both
                       towers and the optimizer: the step training runs) at a
                       global batch of `--step_batch` on a synthetic batch:
                       the step's temporary bytes per device, images/s over
                       `--steps` steps after `--warmup` (compiled first), and
                       the loss of the last step of each form (the two agree
                       to about 1e-5)

The simulated devices share this host's cores (2 here), so the images/s
compare the two forms' work, not a pod's speed. Prints a Markdown table;
`--out` writes the numbers as JSON. Needs no TensorFlow.
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMS = {"full": False, "chunked": True}  # Name -> config.text.chunked.


def _parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--devices", type=int, default=8,
                      help="Simulated CPU devices: the mesh's data axis.")
  parser.add_argument("--loss_batch", type=int, default=4096,
                      help="Global batch of the loss alone.")
  parser.add_argument("--dim", type=int, default=128,
                      help="Embedding width of the loss alone.")
  parser.add_argument("--step_batch", type=int, default=512,
                      help="Global batch of the train step.")
  parser.add_argument("--warmup", type=int, default=2,
                      help="Train steps run before timing.")
  parser.add_argument("--steps", type=int, default=10,
                      help="Train steps timed.")
  parser.add_argument("--out", default=None, help="Write the numbers here.")
  return parser.parse_args(argv)


def _loss_bytes(args, mesh) -> dict:
  """{"loss fwd": {form: {"temp_bytes": ...}}, "loss grad": ...}: the
  compiled loss's temporary bytes per device, embeddings split over
  `data`."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from vit_jax.training import contrastive

  split, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
  rows = jax.ShapeDtypeStruct((args.loss_batch, args.dim), jnp.float32,
                              sharding=split)
  scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=whole)
  wraps = {
      "loss fwd": lambda f: f,
      "loss grad": lambda f: jax.value_and_grad(f, range(4)),
  }
  out = {}
  for row, wrap in wraps.items():
    out[row] = {}
    for form, chunked in FORMS.items():
      loss = lambda *a, c=chunked: contrastive.sigmoid_loss(
          *a, mesh=mesh, batch_axes="data", chunked=c)
      compiled = jax.jit(wrap(loss)).lower(rows, rows, scalar, scalar).compile()
      out[row][form] = {
          "temp_bytes": compiled.memory_analysis().temp_size_in_bytes
      }
  return out


def _digits_config(batch: int, chunked: bool):
  """configs/image_text.py's `digits` recipe at `batch`, decided."""
  sys.path.insert(0, REPO)  # `configs` sits beside the package.
  # pylint: disable=import-outside-toplevel
  from configs import image_text
  from vit_jax import objectives

  config = image_text.get_config("digits")
  config.batch_size = batch
  config.text.chunked = chunked
  return objectives.decide(config)  # Reads the tokenizer's vocabulary.


def _synthetic_batch(config, mesh, seed: int = 0) -> dict:
  """A global batch of the shapes and dtypes the pipeline hands over."""
  # pylint: disable=import-outside-toplevel
  import numpy as np

  from vit_jax import sharding
  from vit_jax.data import handover

  rng = np.random.default_rng(seed)
  b, size = config.batch_size, config.image_size
  images = rng.integers(0, 256, (b, size, size, 3)).astype(np.uint8)
  if not handover.hands_over_uint8(config):  # value_range's [-1, 1] floats.
    images = (images / 127.5 - 1).astype(np.float32)
  batch = {
      "image": images,
      "text": rng.integers(0, config.text.vocab_size, (b, config.text.length),
                           dtype=np.int32),
      "mask": np.ones((b,), np.float32),
  }
  return sharding.to_global_batch(batch, mesh)


def _step_run(args, chunked: bool) -> dict:
  """The `digits` recipe's train step: temporary bytes per device,
  images/s over the timed steps, the last step's loss."""
  # pylint: disable=import-outside-toplevel
  import jax

  from vit_jax import objectives
  from vit_jax import sharding
  from vit_jax.training import optim
  from vit_jax.training import train_state

  config = _digits_config(args.step_batch, chunked)
  mesh = sharding.mesh_from_config(config)
  model = objectives.of(config).model(config, None)
  tx, schedule = optim.make_optimizer(config, config.total_steps,
                                      config.warmup_steps)
  state, shardings = train_state.create_train_state(
      model, tx, config.image_size, config.seed, mesh, config.sharding)
  step = objectives.train_step(config, model, tx, schedule, mesh, shardings)
  batch = _synthetic_batch(config, mesh)
  temp = step.compile(state, batch).memory_analysis().temp_size_in_bytes
  for _ in range(args.warmup):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(args.steps):
    state, metrics = step(state, batch)
  loss = float(metrics["loss"])  # Waits for the last step.
  seconds = time.perf_counter() - start
  return {
      "temp_bytes": temp,
      "images_per_s": args.steps * config.batch_size / seconds,
      "loss": loss,
  }


def _table(numbers: dict) -> str:
  """The Markdown table: a row per program, bytes and images/s per form."""
  lines = [
      "| program | full bytes | chunked bytes | full/chunked | "
      "full images/s | chunked images/s |", "|---|---:|---:|---:|---:|---:|"
  ]
  for row, cells in numbers.items():
    full, chunked = cells["full"], cells["chunked"]
    speeds = [
        f"{cells[f]['images_per_s']:,.0f}" if "images_per_s" in cells[f] else ""
        for f in FORMS
    ]
    lines.append(
        f"| {row} | {full['temp_bytes']:,} | {chunked['temp_bytes']:,} | "
        f"{full['temp_bytes'] / max(chunked['temp_bytes'], 1):.1f}x | " +
        " | ".join(speeds) + " |")
  return "\n".join(lines)


def main(argv=None):
  args = _parse_args(argv)
  # Before JAX is imported: the CPU backend reads its device count once.
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") +
      f" --xla_force_host_platform_device_count={args.devices}").strip()
  import jax  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_platforms", "cpu")  # The simulated devices only.
  if jax.device_count() != args.devices:
    sys.exit(f"{jax.device_count()} devices, not --devices={args.devices} "
             "(JAX was started before XLA_FLAGS was set?)")
  mesh = Mesh(np.array(jax.devices()), ("data",))
  numbers = _loss_bytes(args, mesh)
  numbers["train step"] = {
      form: _step_run(args, chunked) for form, chunked in FORMS.items()
  }
  losses = {f: numbers["train step"][f]["loss"] for f in FORMS}
  print(f"Devices: {args.devices} ({jax.devices()[0].device_kind}); loss "
        f"B={args.loss_batch}, D={args.dim}; train step B={args.step_batch}, "
        f"{args.steps} steps timed after {args.warmup}.")
  print("Loss of the last step: " +
        ", ".join(f"{f} {v:.7f}" for f, v in losses.items()) +
        f" (difference {abs(losses['full'] - losses['chunked']):.1e}).\n")
  print(_table(numbers))
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"args": vars(args), "results": numbers}, f, indent=1)


if __name__ == "__main__":
  main()
