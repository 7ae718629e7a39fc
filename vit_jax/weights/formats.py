"""Reading a weights file of any supported format into named numpy arrays.

The format is decided by what the file is, not by its name:

  orbax        a directory written by this project (a workdir, its
               `checkpoints/` folder or one step of it);
  npz          a numpy archive: released google-research/vision_transformer
               files and big_vision checkpoints (flat 'a/b/c' keys);
  safetensors  timm or Hugging Face weights;
  torch        a PyTorch pickle (`.bin`, `.pth`), read with torch if present.

Every problem (missing path, truncated or foreign file) is a `WeightsError`
that names the file and what was expected.
"""

import json
import os
import struct
import zipfile

import numpy as np

FORMATS = ("orbax", "npz", "safetensors", "torch")


class WeightsError(ValueError):
  """A weights file that cannot be used, with what to do about it."""


def read(path: str) -> tuple[str, dict[str, np.ndarray]]:
  """Returns (format, {name: array}) for the file or directory at `path`."""
  path = os.path.expanduser(path)
  if not os.path.exists(path):
    raise WeightsError(f"No weights at {path}: the path does not exist.")
  if os.path.isdir(path):
    return "orbax", _read_orbax(path)
  fmt = _sniff(path)
  reader = {"npz": _read_npz, "safetensors": _read_safetensors,
            "torch": _read_torch}[fmt]
  return fmt, reader(path)


def read_names(path: str) -> tuple[str, list[str]]:
  """(format, parameter names) without reading the arrays' data."""
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    return "orbax", []  # This project's own layout; names are not needed.
  fmt = _sniff(path)
  if fmt == "npz":
    with zipfile.ZipFile(path) as archive:
      return fmt, [n[:-len(".npy")] for n in archive.namelist()]
  if fmt == "safetensors":
    with open(path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
      header = json.loads(f.read(header_len))
    return fmt, [k for k in header if k != "__metadata__"]
  return fmt, list(_read_torch(path, mmap=True))


def _sniff(path) -> str:
  """The format of a file, from its first bytes (see the module doc)."""
  if not os.path.exists(path):
    raise WeightsError(f"No weights at {path}: the path does not exist.")
  with open(path, "rb") as f:
    head = f.read(16)
  if head.startswith(b"PK"):
    try:
      with zipfile.ZipFile(path) as archive:
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


def _read_npz(path):
  try:
    with np.load(path, allow_pickle=False) as data:
      return {k: np.asarray(data[k]) for k in data.files}
  except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
    raise WeightsError(f"{path} could not be read as .npz (truncated or "
                       f"corrupt?): {e}") from e


def _read_safetensors(path):
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))
    if 8 + header_len > size:
      raise WeightsError(f"{path} is a truncated safetensors file.")
    header = json.loads(f.read(header_len))
  end = max((v["data_offsets"][1] for k, v in header.items()
             if k != "__metadata__"), default=0)
  if 8 + header_len + end > size:
    raise WeightsError(f"{path} is a truncated safetensors file: its header "
                       f"promises {end} bytes of tensors.")
  if any(v.get("dtype") == "BF16" for k, v in header.items()
         if k != "__metadata__"):
    return _read_with_torch_safetensors(path)
  return dict(load_file(path))


def _read_with_torch_safetensors(path):
  torch = _import_torch(path)
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  return {k: v.to(torch.float32).numpy() for k, v in load_file(path).items()}


def _import_torch(path):
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise WeightsError(
        f"Reading {path} needs PyTorch (pip install torch), or convert it to "
        ".safetensors first.") from e
  return torch


def _read_torch(path, mmap: bool = False):
  torch = _import_torch(path)
  try:
    state = torch.load(path, map_location="cpu", weights_only=True,
                       mmap=mmap and _is_zip(path))
  except Exception as e:  # torch raises many types for a bad file.
    raise WeightsError(f"{path} could not be read by torch.load (truncated "
                       f"or not a state dict?): {e}") from e
  for key in ("state_dict", "model", "module"):
    if isinstance(state, dict) and isinstance(state.get(key), dict):
      state = state[key]
  if not isinstance(state, dict):
    raise WeightsError(f"{path} holds a {type(state).__name__}, not a state "
                       "dict of tensors.")
  if mmap:  # Names only: the values stay on disk.
    return {k: None for k, v in state.items() if hasattr(v, "detach")}
  return {k: v.detach().to(torch.float32).numpy() for k, v in state.items()
          if hasattr(v, "detach")}


def _is_zip(path) -> bool:
  with open(path, "rb") as f:
    return f.read(2) == b"PK"


def _read_orbax(path):
  """Parameters of a train-state checkpoint (the average when there is one)."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step_dir = _orbax_step_dir(os.path.abspath(path))  # Orbax needs absolute.
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    tree = checkpointer.metadata(step_dir).item_metadata.tree
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = checkpointer.restore(
        step_dir, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  except Exception as e:  # Orbax raises many types for a bad directory.
    raise WeightsError(f"{step_dir} could not be restored as an Orbax "
                       f"checkpoint: {e}") from e
  params = state.get("ema_params") or state.get("params")
  if not params:
    raise WeightsError(f"The Orbax checkpoint {step_dir} holds no 'params' "
                       f"(it has {sorted(state)}).")
  import flax  # pylint: disable=g-import-not-at-top
  return {k: np.asarray(v) for k, v in
          flax.traverse_util.flatten_dict(params, sep="/").items()}


def _orbax_step_dir(path):
  """WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/STEP -> the item."""
  if os.path.isdir(os.path.join(path, "checkpoints")):
    path = os.path.join(path, "checkpoints")
  steps = [int(d) for d in os.listdir(path) if d.isdigit() and
           os.path.exists(os.path.join(path, d, "_CHECKPOINT_METADATA"))]
  if steps:
    path = os.path.join(path, str(max(steps)))
  if os.path.isdir(os.path.join(path, "default")):
    path = os.path.join(path, "default")
  if not os.path.exists(os.path.join(path, "_METADATA")):
    raise WeightsError(
        f"{path} is a directory but not an Orbax checkpoint of this project "
        "(no finished step with a _METADATA file); pass a workdir, its "
        "checkpoints/ folder or one step of it.")
  return path
