"""The evaluation preprocessing of a config (`config.pp_eval`) in the words
of timm's `pretrained_cfg` and of a transformers image processor, for the
exported directories (`timm_dir.py`, `hf_dir.py`). Parsed here without
TensorFlow: only the pipelines that those libraries can repeat are known.

    resize|value_range                  the whole image resized to size x size
    resize(N)|central_crop|value_range  resized to N x N, central size crop
    resize_small|central_crop|value_range
                                        shorter side to size / 0.875, crop

`value_range` maps [0, 255] to [-1, 1]: mean 0.5 and std 0.5 per channel
after scaling to [0, 1]. Resizing is bilinear.
"""

import dataclasses
import re

from vit_jax.errors import UserError

_CROP_FRACTION = 0.875  # resize_small's (vit_jax/data/preprocess.py).
_OP = re.compile(r"^(\w+)(?:\((\d*)\))?$")
KNOWN = ("resize|value_range", "resize(N)|central_crop|value_range",
         "resize_small|central_crop|value_range")


@dataclasses.dataclass(frozen=True)
class EvalPreprocessing:
  image_size: int  # The square the model sees.
  resize_to: int  # Side of the resize before the crop (image_size: none).
  keep_aspect: bool  # True: the shorter side is resized to `resize_to`.
  mean: tuple = (0.5, 0.5, 0.5)  # Of [0, 1] pixels, per channel.
  std: tuple = (0.5, 0.5, 0.5)

  @property
  def crop_fraction(self) -> float:
    return self.image_size / self.resize_to


def describe(pp_eval: str, image_size: int) -> EvalPreprocessing:
  """`pp_eval` at `image_size`; a pipeline other than `KNOWN` is refused."""
  ops = []
  for part in (p.strip() for p in pp_eval.split("|") if p.strip()):
    match = _OP.match(part)
    ops.append((match.group(1), match.group(2)) if match else (part, None))
  names = [name for name, _ in ops]
  if names == ["resize", "value_range"] and not ops[0][1]:
    return EvalPreprocessing(image_size, image_size, keep_aspect=False)
  if names == ["resize_to_sequence", "value_range", "patchify"]:
    # Images at their own shape; a square image as timm's default.
    return EvalPreprocessing(image_size, image_size, keep_aspect=False)
  if names == ["resize", "central_crop", "value_range"] and ops[0][1]:
    return EvalPreprocessing(image_size, int(ops[0][1]), keep_aspect=False)
  if names == ["resize_small", "central_crop", "value_range"]:
    return EvalPreprocessing(image_size, round(image_size / _CROP_FRACTION),
                             keep_aspect=True)
  raise UserError(
      f"The evaluation preprocessing {pp_eval!r} has no equivalent in timm's "
      f"or transformers' image processing; pass --pp_eval with one of "
      f"{', '.join(KNOWN)} (the one the model is best evaluated with).")
