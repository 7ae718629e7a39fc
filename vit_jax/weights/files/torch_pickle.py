"""PyTorch's `torch.save` files (`.bin`, `.pth`) read without PyTorch.

Since PyTorch 1.6 such a file is a zip: `ARCHIVE/data.pkl`, a pickle of the
state dict in which each tensor is a call of
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` and
each storage a persistent id ('storage', torch.FloatStorage, key, device,
numel) whose bytes lie in `ARCHIVE/data/KEY` (little-endian). The
unpickler here knows only those names (and OrderedDict): anything else in
the pickle, code included, is refused, so a file is data, never a program
(as `torch.load(weights_only=True)`). The older, non-zip format is left to
torch (`formats.py` says so).
"""

import collections
import io
import pickle
import zipfile

import numpy as np

from vit_jax.errors import WeightsError

_DTYPES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:

  def __init__(self, name: str):
    self.name = name


def _rebuild_tensor(storage, offset, size, stride, *unused):
  """The tensor a storage holds at `offset` with `size` and `stride`."""
  del unused
  if not size:
    return storage[offset:offset + 1].reshape(())
  itemsize = storage.itemsize
  return np.lib.stride_tricks.as_strided(
      storage[offset:], shape=tuple(size), strides=tuple(
          s * itemsize for s in stride)).copy()


def _rebuild_parameter(data, *unused):
  del unused
  return data


class _Unpickler(pickle.Unpickler):
  """Builds numpy arrays from the storages of `archive`; refuses any
  other global."""

  def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
    super().__init__(io.BytesIO(data))
    self._archive, self._prefix, self._storages = archive, prefix, {}

  def find_class(self, module, name):
    allowed = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }
    if (module, name) in allowed:
      return allowed[module, name]
    if module == "torch" and name in _DTYPES:
      return _StorageType(name)
    raise pickle.UnpicklingError(f"{module}.{name} is not part of a state "
                                 "dict of tensors")

  def persistent_load(self, pid):
    kind, storage_type, key, _, _ = pid
    if kind != "storage" or not isinstance(storage_type, _StorageType):
      raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
    if key not in self._storages:
      raw = self._archive.read(f"{self._prefix}data/{key}")
      dtype = _DTYPES[storage_type.name]
      if dtype == "bfloat16":  # The upper half of a float32.
        halves = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
        array = halves.view(np.float32)
      else:
        array = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"))
      self._storages[key] = array
    return self._storages[key]


def is_zip_pickle(data: bytes) -> bool:
  return data[:2] == b"PK"


def state_dict(state, path) -> dict:
  """The state dict a saved object holds: itself, or its top-level
  `state_dict`, `model` or `module` entry (training checkpoints)."""
  for key in ("state_dict", "model", "module"):
    if isinstance(state, dict) and isinstance(state.get(key), dict):
      state = state[key]
  if not isinstance(state, dict):
    raise WeightsError(f"{path} holds a {type(state).__name__}, not a state "
                       "dict of tensors.")
  return state


def read(data: bytes, path) -> dict:
  """{name: float32 array} of the state dict a torch.save zip holds (a
  top-level `state_dict`, `model` or `module` entry if it wraps one)."""
  try:
    archive = zipfile.ZipFile(io.BytesIO(data))
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    if len(pickles) != 1:
      raise WeightsError(f"{path} is a zip but not one torch.save wrote (it "
                         "has no ARCHIVE/data.pkl).")
    prefix = pickles[0][:-len("data.pkl")]
    state = _Unpickler(archive.read(pickles[0]), archive, prefix).load()
  except (zipfile.BadZipFile, pickle.UnpicklingError, KeyError, ValueError,
          EOFError) as e:
    raise WeightsError(f"{path} could not be read as a PyTorch state dict "
                       f"(truncated, or not a state dict?): {e}") from e
  state = state_dict(state, path)
  return {
      k: np.asarray(v, np.float32)
      for k, v in state.items()
      if isinstance(v, np.ndarray)
  }
