"""One tower of a two-tower file (SigLIP's image and text encoders).

big_vision names a tower as `FILE:TOWER` (`siglip.npz:img`); a file whose
top level is `img/` and `txt/` and that names none gives its image tower,
and the load report says so and what it left out.
"""

from typing import Optional

from vit_jax.errors import WeightsError
from vit_jax.weights.files import formats


def select(tensors, path) -> tuple[dict, Optional[str]]:
  """The entries of the tower `path` names (`FILE:TOWER`), or of the image
  tower `img/` of a two-tower file (SigLIP's) that names none, without the
  tower's prefix; other files as they are."""
  _, tower = formats.split_tower(path)
  # Top-level entries, folders with a trailing '/' (img/, txt/, t, b).
  top = sorted(
      {name.split("/")[0] + ("/" if "/" in name else "") for name in tensors})
  if tower is None:
    if "img/" not in top or "Transformer/" in top:
      return tensors, None
    tower = "img"
    note = ("read the image tower (img/) of a two-tower file; left out "
            f"{', '.join(t for t in top if t != 'img/')}")
  else:
    note = f"read the tower {tower}/ that the path names"
  picked = {
      name[len(tower) + 1:]: value
      for name, value in tensors.items()
      if name.startswith(tower + "/")
  }
  if not picked:
    raise WeightsError(f"{path} has no tower {tower!r}: its top-level names "
                       f"are {', '.join(top)}.")
  return picked, note
