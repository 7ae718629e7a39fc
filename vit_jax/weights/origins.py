"""Which code base wrote a weights file, and its room's converter.

Each origin is a row of `ORIGINS`: how reports name it, the GELU its
models compute, the function that converts its files into this project's
names, and for PyTorch files whether their names are its own. The rooms
(`big_vision/`, `timm/`, `transformers/`, `mae/`) hold that knowledge and
register their rows here when `vit_jax.weights` is imported (its
`__init__` imports them); this module imports no room. `detect` decides
the origin by the whole set of names; `stated_options` reads what a timm
or transformers directory's config.json says, by the room that claims it
(`CONFIG_READERS`).
"""

from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Sequence

from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.weights import unsupported
from vit_jax.weights.files import directories
from vit_jax.weights.files import formats
from vit_jax.weights.names import Converted

TORCH_FORMATS = ("safetensors", "torch")


class Origin(NamedTuple):
  words: str  # How reports name it.
  # The GELU its models compute: True the tanh approximation (both Google
  # code bases), False the exact erf; None: its file says (an Orbax
  # workdir's config.json, `loader.origin_gelu`).
  gelu_approximate: Optional[bool]
  # (format, tensors, num_heads, path) -> Converted.
  convert: Callable[[str, dict, int, str], Converted]
  # A PyTorch file's names -> whether they are this origin's; asked in
  # `rank` order (lowest first). None: it writes no PyTorch files.
  claims: Optional[Callable[[Sequence[str]], bool]] = None
  rank: int = 0
  # A file's names -> the `config.model` options they show but its
  # weights cannot (timm's NaFlexViT: its position-table resizing).
  name_options: Optional[Callable[[dict], dict]] = None


class ConfigReader(NamedTuple):
  """How a room reads the config.json beside a weights file."""
  claims: Callable[[dict], bool]
  rank: int  # Asked lowest first.
  stated_options: Callable[[dict], dict]  # The config.model fields it says.
  # The family it names that no room computes, or None.
  unsupported: Callable[[dict], Optional[unsupported.Unsupported]]
  # The image tower's attention heads it says (PyTorch files do not
  # show them); 0: it does not say.
  heads: Callable[[dict], int]


class FlaxReader(NamedTuple):
  """How the room of Google's Flax files reads them (npz, Orbax)."""
  # (names, path) -> which of its origins wrote them (or WeightsError).
  origin: Callable[[Sequence[str], str], str]
  # (tensors, path) -> (the tensors of the one tower loading reads,
  # what the report says of that tower or None).
  tower: Callable[[dict, str], tuple[dict, Optional[str]]]


ORIGINS: dict[str, Origin] = {}
CONFIG_READERS: dict[str, ConfigReader] = {}
_FLAX: dict[str, FlaxReader] = {}


def register(name: str, origin: Origin):
  """A room's origin (a key of ORIGINS; `orbax`: this project's own)."""
  ORIGINS[name] = origin


def register_config_reader(name: str, reader: ConfigReader):
  CONFIG_READERS[name] = reader


def register_flax(reader: FlaxReader):
  _FLAX["reader"] = reader


def _flax() -> FlaxReader:
  return _FLAX["reader"]


def words(origin: str) -> str:
  return ORIGINS[origin].words if origin in ORIGINS else origin


def detect(fmt: str, names, path: str) -> str:
  """Which code base wrote the file, decided by the whole set of names:
  `orbax` (this project's workdirs), one of the Flax origins (released,
  big_vision, ...: `FlaxReader.origin` says how), or for PyTorch files
  the first origin in `rank` order whose `claims` they meet. A file of a
  family no room computes is refused (`unsupported`)."""
  if fmt == "orbax":
    return "orbax"
  if fmt not in TORCH_FORMATS:
    return _flax().origin(names, path)
  _refuse_unsupported_directory(path)
  for table in (unsupported.TIMM, unsupported.TRANSFORMERS):
    refused = unsupported.find(table, names)
    if refused:
      raise WeightsError(unsupported.refusal(refused, path))
  for name, origin in sorted(ORIGINS.items(), key=lambda row: row[1].rank):
    if origin.claims is not None and origin.claims(names):
      return name
  raise WeightsError(f"{path} holds PyTorch weights but neither timm's nor "
                     "Hugging Face's ViT names (e.g. 'blocks.0.attn.qkv."
                     "weight' or 'vit.embeddings.cls_token').")


def convert(fmt: str, tensors: dict, num_heads: int, path: str) -> Converted:
  """The file's tensors in this project's names, by its origin's room."""
  origin = detect(fmt, list(tensors), path)
  return ORIGINS[origin].convert(fmt, tensors, num_heads, path)


def tower(tensors: dict, path: str) -> tuple[dict, Optional[str]]:
  """A Flax file's tensors of the tower loading reads, and what the report
  says of it (None: the file has one)."""
  return _flax().tower(tensors, path)


def name_options(origin: str, names) -> dict:
  """What the names of a file of `origin` show (`Origin.name_options`)."""
  row = ORIGINS.get(origin)
  if row is None or row.name_options is None:
    return {}
  return row.name_options(dict.fromkeys(names))


def _config_reader(path) -> tuple[Optional[dict], Optional[ConfigReader]]:
  """(config.json, the room's reader that claims it) of a timm or
  transformers directory; (None, None) for anything else."""
  config = directories.config_json(paths.resolve(formats.split_tower(path)[0]))
  if config is None:
    return None, None
  for reader in sorted(CONFIG_READERS.values(), key=lambda r: r.rank):
    if reader.claims(config):
      return config, reader
  return config, None


def stated_options(path) -> dict:
  """The `config.model` fields a timm or transformers directory's
  config.json states (the activation, the LayerNorm epsilon, a
  NaFlexViT's resizing); {} for anything else."""
  config, reader = _config_reader(path)
  return {} if reader is None else reader.stated_options(config)


def stated_heads(path) -> int:
  """The image tower's attention heads a directory's config.json states
  (transformers' SigLIP's; PyTorch files do not show them); 0 otherwise."""
  config, reader = _config_reader(path)
  return 0 if reader is None else reader.heads(config)


def _refuse_unsupported_directory(path):
  """A directory whose config.json names a family no room computes."""
  config, reader = _config_reader(path)
  family = None if reader is None else reader.unsupported(config)
  if family is not None:
    raise WeightsError(unsupported.refusal(family, path))
