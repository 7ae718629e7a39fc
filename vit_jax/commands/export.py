"""The export command: a model's weights for other code bases, from any
readable file (`vit_jax/weights/writers.py`).

    vit-jax export --checkpoint=workdirs/demo/pretrain \
        --format=npz --out=/tmp/digits.npz
    vit-jax export --checkpoint=/tmp/digits.npz \
        --format=timm --out=/tmp/digits.safetensors

(or `python -m vit_jax export ...`). `npz` is the released
google-research/vision_transformer layout, which its code and this project
load; `timm` a safetensors file with the state dict of timm's
`VisionTransformer` (see `vit_jax/weights/writers.py`). Imports no
TensorFlow.
"""

from absl import flags

from vit_jax import cli
from vit_jax import console
from vit_jax.weights import writers

flags.DEFINE_string("checkpoint", None, "Weights to read (any format).")
flags.DEFINE_enum("format", "npz", writers.EXPORT_FORMATS, "Layout to write.")
flags.DEFINE_string("out", None, "File to write.")
flags.DEFINE_integer("num_heads", 0,
                     "Attention heads; needed only to read PyTorch weights.",
                     lower_bound=0)
flags.mark_flags_as_required(["checkpoint", "out"])


def main(argv):
  del argv
  f = flags.FLAGS
  console.say("Reading %s.", f.checkpoint)  # Big files take a while.
  params = writers.released_params(f.checkpoint, f.num_heads)
  console.say("Writing %s to %s as %s.", f.checkpoint, f.out, f.format)
  save = {"npz": writers.save_npz, "timm": writers.save_timm}[f.format]
  left_out = save(params, f.out) or []
  if left_out:
    console.say(
        "Left out masked patch prediction's [mask] token and "
        "prediction head (%d arrays): timm's model has no place for "
        "them.", len(left_out))
  written = {k: v for k, v in params.items() if k not in left_out}
  count = sum(v.size for v in written.values())
  print(f"Wrote {len(written)} arrays ({count:,} parameters) to {f.out}.")


if __name__ == "__main__":
  cli.run(main)
