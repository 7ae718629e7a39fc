"""Reading a weights file of any supported format into named numpy arrays.

The format is decided by what the file is, not by its name:

  orbax        a directory written by this project (a workdir, its
               `checkpoints/` folder or one step of it): only its
               parameters (or their average) are read;
  npz          a numpy archive: released google-research/vision_transformer
               files and big_vision checkpoints (flat 'a/b/c' keys);
  safetensors  timm or Hugging Face weights, or a directory of theirs
               (`directories.py`: config.json and model.safetensors);
  torch        a PyTorch pickle (`.bin`, `.pth`): torch.save's zip read
               without PyTorch (`torch_pickle.py`), the legacy format with
               it.

`FILE:TOWER` names one tower of a two-tower file (SigLIP's `FILE:img`); the
converter (`big_vision/towers.py`) picks it out. Paths may be local, URLs (`gs://...`,
see `vit_jax.paths`) or names of released checkpoints (`ViT-B/16@i21k`): a file
at a URL or by name is read from its copy in the local cache (`cache.locate`,
which downloads it once). `cache_dir` is config.init.cache_dir (None: the
default). Every problem (missing path, truncated or foreign file) is a
`WeightsError` that names the file and what was expected.
"""

import io
import json
import re
import struct
from typing import Optional
import zipfile

from etils import epath
import numpy as np

from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.weights.files import cache
from vit_jax.weights.files import directories
from vit_jax.weights.files import released
from vit_jax.weights.files import torch_pickle

FORMATS = ("orbax", "npz", "safetensors", "torch")


def read(path: str, cache_dir=None) -> tuple[str, dict[str, np.ndarray]]:
  """Returns (format, {name: array}) for the file or directory at `path`."""
  path = _existing(path, cache_dir)
  if path.is_dir():
    return "orbax", _read_orbax(path)
  fmt = _sniff(path)
  reader = {
      "npz": _read_npz,
      "safetensors": _read_safetensors,
      "torch": _read_torch
  }[fmt]
  return fmt, reader(path)


def read_names(path: str, cache_dir=None) -> tuple[str, list[str]]:
  """(format, parameter names) without reading the arrays' data."""
  path = _existing(path, cache_dir)
  if path.is_dir():
    return "orbax", []  # This project's own; names are not needed.
  fmt = _sniff(path)
  if fmt == "npz":
    with path.open("rb") as f, zipfile.ZipFile(f) as archive:
      return fmt, [n[:-len(".npy")] for n in archive.namelist()]
  if fmt == "safetensors":
    return fmt, [k for k in _safetensors_header(path) if k != "__metadata__"]
  return fmt, list(_read_torch(path, names_only=True))


def split_tower(path) -> tuple[str, Optional[str]]:
  """'FILE:TOWER' -> (FILE, TOWER), big_vision's way of naming one tower of
  a two-tower file (`siglip.npz:img`); any other path -> (path, None)."""
  match = re.fullmatch(r"(.+[^:/]):([A-Za-z_]\w*)", str(path))
  return (match.group(1), match.group(2)) if match else (str(path), None)


def _existing(path, cache_dir=None) -> epath.Path:
  path, _ = split_tower(path)
  resolved = paths.resolve(cache.locate(path, cache_dir))
  if not resolved.exists():
    hint = "" if paths.is_remote(path) else released.unknown_name_hint(
        str(path))
    raise WeightsError(f"No weights at {path}: the path does not exist."
                       f"{' ' + hint if hint else ''}")
  return directories.weights_file(resolved) or resolved


def _sniff(path: epath.Path) -> str:
  """The format of a file, from its first bytes (see the module doc)."""
  with path.open("rb") as f:
    head = f.read(16)
    if head.startswith(b"PK"):
      f.seek(0)
      try:
        with zipfile.ZipFile(f) as archive:
          names = archive.namelist()
      except zipfile.BadZipFile as e:
        raise WeightsError(f"{path} is a truncated or corrupt zip archive "
                           f"(npz or PyTorch file): {e}.") from e
      if names and all(n.endswith(".npy") for n in names):
        return "npz"
      if any(n.endswith("data.pkl") for n in names):
        return "torch"
      raise WeightsError(f"{path} is a zip archive but neither an .npz nor a "
                         "PyTorch checkpoint.")
  if len(head) >= 9 and head[8:9] == b"{":
    return "safetensors"
  if head[:1] == b"\x80":  # A pickle: PyTorch's legacy (pre-zip) format.
    return "torch"
  raise WeightsError(
      f"{path} is not a weights file this project reads: expected an Orbax "
      "checkpoint directory, a .npz, a .safetensors or a PyTorch .bin/.pth.")


def _read_npz(path: epath.Path):
  try:
    with path.open("rb") as f, np.load(f, allow_pickle=False) as data:
      return {k: np.asarray(data[k]) for k in data.files}
  except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
    raise WeightsError(f"{path} could not be read as .npz (truncated or "
                       f"corrupt?): {e}") from e


def _safetensors_header(path: epath.Path) -> dict:
  size = path.stat().length
  with path.open("rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))
    if 8 + header_len > size:
      raise WeightsError(f"{path} is a truncated safetensors file.")
    header = json.loads(f.read(header_len))
  end = max(
      (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
      default=0)
  if 8 + header_len + end > size:
    raise WeightsError(f"{path} is a truncated safetensors file: its header "
                       f"promises {end} bytes of tensors.")
  return header


def _read_safetensors(path: epath.Path):
  header = _safetensors_header(path)
  if any(
      v.get("dtype") == "BF16"
      for k, v in header.items()
      if k != "__metadata__"):
    return _read_with_torch_safetensors(path)
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  if paths.is_remote(path):
    return dict(st_numpy.load(path.read_bytes()))
  return dict(st_numpy.load_file(str(path)))


def _read_with_torch_safetensors(path: epath.Path):
  torch = _import_torch(path)
  from safetensors import torch as st_torch  # pylint: disable=g-import-not-at-top
  tensors = (st_torch.load(path.read_bytes())
             if paths.is_remote(path) else st_torch.load_file(str(path)))
  return {k: v.to(torch.float32).numpy() for k, v in tensors.items()}


def _import_torch(path):
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise WeightsError(
        f"Reading {path} needs PyTorch (pip install torch), or convert it to "
        ".safetensors first.") from e
  return torch


def _read_torch(path: epath.Path, names_only: bool = False):
  data = path.read_bytes()
  if torch_pickle.is_zip_pickle(data):  # torch.save's since 1.6: no torch.
    tensors = torch_pickle.read(data, path)
    return dict.fromkeys(tensors) if names_only else tensors
  torch = _import_torch(path)  # The legacy format: torch's own reader.
  local = not paths.is_remote(path)
  try:
    source = str(path) if local else io.BytesIO(path.read_bytes())
    state = torch.load(source, map_location="cpu", weights_only=True,
                       mmap=names_only and local and _is_zip(path))
  except Exception as e:  # torch raises many types for a bad file.
    raise WeightsError(f"{path} could not be read by torch.load (truncated "
                       f"or not a state dict?): {e}") from e
  state = torch_pickle.state_dict(state, path)
  if names_only:  # The values stay on disk.
    return {k: None for k, v in state.items() if hasattr(v, "detach")}
  return {
      k: v.detach().to(torch.float32).numpy()
      for k, v in state.items()
      if hasattr(v, "detach")
  }


def _is_zip(path: epath.Path) -> bool:
  with path.open("rb") as f:
    return f.read(2) == b"PK"


def _read_orbax(path: epath.Path):
  """The parameters of a train-state checkpoint, and nothing else: the
  average when the run kept one, else the parameters (no optimizer state,
  so host memory stays about one model's size)."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step_dir = _orbax_step_dir(path)
  # The step as saved: a composite of one PyTree item, "default".
  checkpointer = ocp.Checkpointer(
      ocp.CompositeCheckpointHandler(default=ocp.PyTreeCheckpointHandler()))
  try:
    tree = checkpointer.metadata(step_dir).item_metadata["default"].tree
    key = "ema_params" if tree.get("ema_params") else "params"
    if not tree.get(key):
      raise WeightsError(f"The Orbax checkpoint {step_dir} holds no 'params' "
                         f"(it has {sorted(tree)}).")
    item = {
        key: jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype),
                          tree[key])
    }
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    state = checkpointer.restore(
        step_dir, args=ocp.args.Composite(
            default=ocp.args.PyTreeRestore(item=item, restore_args=restore_args,
                                           partial_restore=True)))["default"]
  except WeightsError:
    raise
  except Exception as e:  # Orbax raises many types for a bad directory.
    raise WeightsError(f"{step_dir} could not be restored as an Orbax "
                       f"checkpoint: {e}") from e
  import flax  # pylint: disable=g-import-not-at-top
  return {
      k: np.asarray(v)
      for k, v in flax.traverse_util.flatten_dict(state[key], sep="/").items()
  }


def _orbax_step_dir(path: epath.Path) -> epath.Path:
  """WORKDIR, WORKDIR/checkpoints, WORKDIR/checkpoints/STEP or its item
  folder (STEP/default) -> the step."""
  if (path / paths.CHECKPOINTS_DIR).is_dir():
    path = path / paths.CHECKPOINTS_DIR
  steps = [
      int(d.name)
      for d in path.iterdir()
      if d.name.isdigit() and (d / "_CHECKPOINT_METADATA").exists()
  ]
  if steps:
    path = path / str(max(steps))
  if path.name == "default" and (path / "_METADATA").exists():
    path = path.parent
  if not (path / "default" / "_METADATA").exists():
    raise WeightsError(
        f"{path} is a directory but not an Orbax checkpoint of this project "
        "(no finished step with a _METADATA file); pass a workdir, its "
        "checkpoints/ folder or one step of it.")
  return path
