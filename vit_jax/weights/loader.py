"""Loading any supported weights file into a model's parameter tree.

    loaded, report = load(path, target, num_prefix_tokens=1, grid=(24, 24))
    params = init_params(config, path, params, params_sharding)  # Training.

`target` is the model's (abstract) parameter tree. Every target parameter is
either loaded (same shape), resized (position embeddings, by 2D
interpolation), or re-initialised by policy: a head whose number of classes
differs (or that the file lacks), the parts of masked patch prediction the
file lacks or has for another target, and whatever `dont_load` names. File
entries the target has no place for are dropped only by policy (a pre-logits
layer when the config has none, the parts of masked patch prediction when
the model is not pre-trained that way, or `dont_load`). Anything else (missing,
unexpected or differently shaped parameters) refuses the whole load with the
report's table, or with one line where the file's blocks have other block
options (`config.model.parallel_block`, ...) than the model's: nothing is
half-loaded.

`path` may also be a URL or a released checkpoint's name (`ViT-B/16@i21k`,
see `released.py`): it is read from the local cache (`cache.py`), and a
name of another variant than the config's is refused before downloading.
"""

import dataclasses
import os
import re
from typing import Optional
from typing import Sequence

from absl import logging
import flax
import jax
import ml_collections
import numpy as np

from vit_jax import console
from vit_jax import models
from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.models import patch_resize
from vit_jax.models import scan
from vit_jax.models import variants
from vit_jax.weights import convert
from vit_jax.weights import families
from vit_jax.weights import formats
from vit_jax.weights import mixer_layout
from vit_jax.weights import posemb
from vit_jax.weights import pytorch_dir
from vit_jax.weights import released
from vit_jax.weights import timm_naflex

POSEMB = convert.POSEMB
FACTORIZED = (POSEMB + "_y", POSEMB + "_x")  # NaViT's per-axis tables.
PATCH_KERNEL = "embedding/kernel"
GELU_NAMES = {True: "tanh approximation", False: "exact erf"}


@dataclasses.dataclass
class Report:
  """What happened to every parameter; `table()` prints it."""
  path: str
  origin: str  # The code base that wrote the file (convert.detect_origin).
  matched: list = dataclasses.field(default_factory=list)
  # (name, old shape, new shape, how).
  resized: list = dataclasses.field(default_factory=list)
  reinitialised: list = dataclasses.field(default_factory=list)  # (name, why)
  dropped: list = dataclasses.field(default_factory=list)  # (name, why)
  missing: list = dataclasses.field(default_factory=list)
  unexpected: list = dataclasses.field(default_factory=list)
  mismatched: list = dataclasses.field(default_factory=list)  # (name, f, t)
  warnings: list = dataclasses.field(default_factory=list)
  notes: list = dataclasses.field(default_factory=list)  # What was read.
  gelu: str = ""  # The GELU of the file's origin and of the model.

  @property
  def ok(self) -> bool:
    return not (self.missing or self.unexpected or self.mismatched)

  def summary(self) -> str:
    """One line: what loaded, and what did not."""
    parts = [f"{len(self.matched)} parameters loaded"]
    for what, items in (("resized", self.resized),
                        ("re-initialised", self.reinitialised), ("dropped",
                                                                 self.dropped)):
      if items:
        parts.append(f"{len(items)} {what} "
                     f"({', '.join(str(i[0]) for i in items[:3])}"
                     f"{', ...' if len(items) > 3 else ''})")
    return f"{self.path}: {'; '.join(parts)}"

  def table(self, limit: int = 12) -> str:
    rows = [
        f"{self.path} (written by {convert.origin_words(self.origin)}): "
        f"{len(self.matched)} matching"
    ]
    rows += [f"  {note}" for note in self.notes]
    if self.gelu:
      rows.append(f"  GELU: {self.gelu}")
    resized = [f"{n}: {o} -> {t} ({how})" for n, o, t, how in self.resized]
    reinitialised = [f"{n} ({why})" for n, why in self.reinitialised]
    dropped = [f"{n} ({why})" for n, why in self.dropped]
    mismatched = [f"{n}: {f} vs {t}" for n, f, t in self.mismatched]
    sections = (
        ("resized", resized),
        ("re-initialised", reinitialised),
        ("dropped from the file", dropped),
        ("MISSING from the file", self.missing),
        ("UNEXPECTED in the file", self.unexpected),
        ("SHAPE MISMATCH (file vs config)", mismatched),
        ("warnings", self.warnings),
    )
    for title, items in sections:
      if items:
        rows.append(f"  {title} ({len(items)}):")
        rows += [f"    {item}" for item in items[:limit]]
        if len(items) > limit:
          rows.append(f"    ... and {len(items) - limit} more")
    return "\n".join(rows)


def _num_heads(target_flat) -> int:
  """The target's attention heads; 0 for an MLP-Mixer (no attention)."""
  for name, leaf in target_flat.items():
    if name.endswith("MultiHeadDotProductAttention_1/query/kernel"):
      return leaf.shape[-2]
  if mixer_layout.is_mixer(target_flat):
    return 0
  raise ValueError("The target model has no encoder attention.")


def _check_family(path: str, target_flat, cache_dir):
  """A ViT file for a Mixer config or the reverse, said before converting
  (a PyTorch ViT cannot even be split into heads for a Mixer)."""
  fmt, names = formats.read_names(path, cache_dir)
  if fmt == "orbax":
    return  # Names unread here; the table says what does not fit.
  file_mixer, model_mixer = (mixer_layout.is_mixer(names),
                             mixer_layout.is_mixer(target_flat))
  if file_mixer != model_mixer:
    kinds = {True: "an MLP-Mixer", False: "a ViT"}
    raise WeightsError(
        f"{path} holds {kinds[file_mixer]} but the config's model is "
        f"{kinds[model_mixer]}; set config.model.variant to a "
        f"{'Mixer-' if file_mixer else 'ViT-'}... variant of its size.")


def _matches(regexes: Sequence[str], name: str) -> bool:
  return any(re.fullmatch(r, name) for r in regexes)


def read_converted(path: str, num_heads: int,
                   cache_dir=None) -> convert.Converted:
  fmt, tensors = formats.read(path, cache_dir)
  return convert.convert(fmt, tensors, num_heads, path)


def training_workdir(path: str):
  """The workdir an Orbax checkpoint lies in: PATH itself, or what holds
  PATH's `checkpoints/` folder."""
  workdir = paths.resolve(path)
  for parent in [workdir, *workdir.parents]:
    if parent.name == paths.CHECKPOINTS_DIR:
      return parent.parent
  return workdir


def recorded_config(path: str) -> Optional[dict]:
  """The config.json of the workdir an Orbax checkpoint lies in, None if
  absent."""
  if pytorch_dir.weights_file(paths.resolve(path)):
    return None  # transformers' or timm's config.json, not a workdir's.
  config_path = training_workdir(path) / paths.CONFIG_FILE
  if not config_path.exists():
    return None
  return pytorch_dir.read_config_json(config_path)


def origin_gelu(path: str, origin: str) -> Optional[bool]:
  """The GELU form the file's origin computes (True: tanh), None if unknown.

  An Orbax workdir says it in its config.json; one written before the
  option existed computed the exact erf form.
  """
  if origin != "orbax":  # A directory's config.json may say otherwise.
    stated = {
        **naflex_options(path, origin),
        **pytorch_dir.model_options(paths.resolve(path))
    }
    return stated.get("gelu_approximate",
                      convert.ORIGIN_GELU_APPROXIMATE.get(origin))
  recorded = recorded_config(path)
  if recorded is None:
    return None
  model = recorded.get("model", {})
  value = model.get("gelu_approximate", False)
  return None if value is None else bool(value)


def naflex_options(path: str, origin: str, cache_dir=None) -> dict:
  """What a timm NaFlexViT file's names say of the options its weights
  cannot show (`timm_naflex.options`); {} for any other file."""
  if origin != "timm":
    return {}
  names = dict.fromkeys(formats.read_names(path, cache_dir)[1])
  return timm_naflex.options(names) if timm_naflex.is_naflex(names) else {}


def file_origin(path: str, cache_dir=None) -> tuple[str, Optional[bool]]:
  """(origin, the GELU form it computes) of a weights file, reading names
  only."""
  fmt, names = formats.read_names(path, cache_dir)
  origin = convert.detect_origin(fmt, names, path)
  return origin, origin_gelu(path, origin)


def check_released_variant(checkpoint: str, variant: str):
  """Refuses a released checkpoint's name with another model variant."""
  entry = released.lookup(str(checkpoint))
  if (entry is None or entry.variant == variant or
      os.path.exists(os.path.expanduser(str(checkpoint)))):
    return
  raise WeightsError(
      f"{checkpoint} is a {entry.variant} checkpoint but config.model.variant "
      f"is {variant}; set --config.model.variant={entry.variant}, or name a "
      f"checkpoint of {variant}.")


def target_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  stride = variants.get_variant(config.model.variant).stride
  return (config.image_size // stride,) * 2


def load_for_config(config: ml_collections.ConfigDict, path: str, params):
  """`load` with the config's policy; `params` may be scanned (models/scan.py).

  Returns (loaded {looped name: array}, Report).
  """
  check_released_variant(path, config.model.variant)
  if scan.is_scanned(params):
    params = jax.eval_shape(scan.unstack_layers, params)
  return load(path, params, num_prefix_tokens=models.posemb_prefix_tokens(
      config.model), grid=target_grid(config), dont_load=config.init.dont_load,
              resize_method=config.init.posemb_resize,
              source_grid=config.init.source_grid,
              gelu_approximate=config.model.gelu_approximate,
              cache_dir=config.init.cache_dir)


def init_params(config: ml_collections.ConfigDict, path: str, params,
                params_sharding, fill=None, role: str = "Initialised"):
  """`params` with every entry the file at `path` provides replaced, sharded.

  `params` may be abstract (ShapeDtypeStructs): then `fill()` makes the
  parameters the file does not provide (random init), only if it lacks
  some. `role` starts the console line (a teacher's is not an
  initialisation). Works on any mesh and number of processes: each process
  reads the file and places only its own shards. A scanned-layers model is
  loaded through the looped names and stacked back.
  """
  loaded, report = load_for_config(config, path, params)
  console.say("%s from %s (--log_level=info shows the table).", role,
              report.summary())
  if jax.process_index() == 0:
    logging.info("%s from %s", role, report.table())
  if scan.is_scanned(params):
    loaded = scan.stack_flat(loaded, scan.num_scanned_layers(params))
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  if fill is not None and set(flat) - set(loaded):
    flat = flax.traverse_util.flatten_dict(fill(), sep="/")
  shardings = flax.traverse_util.flatten_dict(params_sharding, sep="/")
  for name, value in loaded.items():
    flat[name] = jax.make_array_from_callback(value.shape, shardings[name],
                                              lambda index, v=value: v[index])
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def load(path: str, target, *, num_prefix_tokens: int, grid,
         dont_load: Sequence[str] = (), resize_method: str = "bilinear",
         source_grid: Optional[Sequence[int]] = None,
         gelu_approximate: Optional[bool] = None, cache_dir=None):
  """Returns ({name: array} of what was loaded, Report); raises WeightsError.

  `target`: the model's parameter tree (arrays or ShapeDtypeStructs) in the
  looped form (`models.scan.unstack_layers` for a scanned one).
  `num_prefix_tokens`: tokens before the patch grid in the target (1 with a
  class token, else 0). `grid`: the target's (H, W) token grid.
  `gelu_approximate`: the model's GELU form, compared with the file's origin.
  `cache_dir`: where a file at a URL or by released name is kept (None: the
  default of `cache.cache_root`).
  """
  target_flat = flax.traverse_util.flatten_dict(target, sep="/")
  _check_family(path, target_flat, cache_dir)
  source = read_converted(path, _num_heads(target_flat), cache_dir)
  report = Report(path=path, origin=source.origin, notes=list(source.notes))
  if POSEMB not in source.params and POSEMB not in target_flat:
    report.notes.append("position embeddings: fixed 2D sin-cos (sincos2d), "
                        "none stored")
  _check_dont_load(dont_load, target_flat, source.params, path)
  _compare_gelu(origin_gelu(path, source.origin), gelu_approximate, report)
  loaded = {}
  for name, leaf in target_flat.items():
    shape = tuple(leaf.shape)
    value = source.params.get(name)
    if _matches(dont_load, name):
      report.reinitialised.append((name, "config.init.dont_load"))
    elif value is None:
      if name.startswith("head/") or convert.is_masked_patch_part(name):
        report.reinitialised.append((name, "not in the file"))
      else:
        report.missing.append(name)
    elif name == POSEMB:
      value = _resize(value, shape, source, num_prefix_tokens, grid,
                      resize_method, source_grid, report)
      if value is not None:
        loaded[name] = value
    elif tuple(value.shape) == shape:
      loaded[name] = value
      report.matched.append(name)
    elif name in FACTORIZED and value.shape[::2] == shape[::2]:
      # One axis's table, resized along it as a grid of one column.
      loaded[name] = posemb.resize_grid(value[0][:, None], (shape[1], 1),
                                        resize_method)[None, :, 0]
      report.resized.append(
          (name, tuple(value.shape), shape,
           f"{value.shape[1]} -> {shape[1]}, {resize_method}"))
    elif (k := mixer_layout.tiles_between(value.shape, shape, name)):
      loaded[name] = mixer_layout.tile_token_mixing(name, value, k)
      report.resized.append((name, tuple(
          value.shape), shape, f"{k * k} tiles, block-diagonal: the Mixer "
                             "paper's Supplementary C"))
    elif name == PATCH_KERNEL and value.shape[2:] == shape[2:]:
      loaded[name] = patch_resize.pi_resize(value, shape[:2])
      report.resized.append((name, tuple(
          value.shape), shape, "PI-resize, as FlexiViT"))
    elif name.startswith("head/"):
      report.reinitialised.append(
          (name, f"{value.shape[-1]} classes in the file, {shape[-1]} in the "
           "config"))
    elif name.startswith("masked_patch_head/Dense_1/"):  # Target-dependent.
      report.reinitialised.append(
          (name, f"{value.shape[-1]} outputs in the file, {shape[-1]} for "
           "the config's config.masked_patch"))
    else:
      report.mismatched.append((name, tuple(value.shape), shape))
  has_head = any(k.startswith("head/") for k in target_flat)
  for name in source.params:
    if name in target_flat:
      continue
    if _matches(dont_load, name):
      report.dropped.append((name, "config.init.dont_load"))
    elif name.startswith("head/") and not has_head:
      report.dropped.append((name, "the model has no head"))
    elif name.startswith("pre_logits/"):
      report.dropped.append((name, "config.model.representation_size=None"))
    elif convert.is_masked_patch_part(name):
      report.dropped.append((name, "masked patch prediction only"))
    else:
      report.unexpected.append(name)
  _warn_zero_head(loaded, report)
  if not report.ok:
    other_block = families.other_block(path, source.params, target_flat)
    if other_block and all(
        families.BLOCK_OPTION_NAMES.search(name)
        for name in report.missing + report.unexpected +
        [m[0] for m in report.mismatched]):  # Nothing else differs.
      raise WeightsError(other_block)
    raise WeightsError(
        f"{path} does not fit this model; nothing was loaded.\n"
        f"{report.table()}\n{other_block + chr(10) if other_block else ''}"
        f"{_hint(source.params, target_flat)}Name the "
        "parameters to re-initialise (and file entries to ignore) in "
        "config.init.dont_load, or pick the config.model that wrote the file.")
  loaded = {
      k: np.asarray(v, dtype=target_flat[k].dtype) for k, v in loaded.items()
  }
  return loaded, report


def _resize(value, shape, source, num_prefix_tokens, grid, method, source_grid,
            report):
  """The file's position embeddings on the target grid, or None (mismatch)."""
  if value.ndim == 2:
    value = value[None]
  if value.shape[-1] != shape[-1]:
    report.mismatched.append((POSEMB, tuple(value.shape), shape))
    return None
  prefix = source.posemb_prefix_tokens
  old_grid = (tuple(source_grid) if source_grid else posemb.square_grid(
      value.shape[1] - prefix, source.origin))
  resized = posemb.resize_posemb(value, prefix, old_grid, grid, method)
  # Prefix tokens: keep, drop (no class token in the target), or add a zero
  # one (the file's class token had no position embedding: same model).
  if prefix > num_prefix_tokens:
    resized = resized[:, prefix - num_prefix_tokens:]
  elif prefix < num_prefix_tokens:
    zeros = np.zeros((1, num_prefix_tokens - prefix, shape[-1]), value.dtype)
    resized = np.concatenate([zeros, resized], axis=1)
  if tuple(resized.shape) != shape:
    report.mismatched.append((POSEMB, tuple(value.shape), shape))
    return None
  if tuple(value.shape) == shape and old_grid == tuple(grid):
    report.matched.append(POSEMB)
  else:
    report.resized.append((POSEMB, tuple(
        value.shape), shape, f"{old_grid[0]}x{old_grid[1]} -> "
                           f"{grid[0]}x{grid[1]} grid, {method}"))
  return resized


def _check_dont_load(dont_load, target_flat, file_params, path):
  """Each regex must name a model parameter or a file entry (typo guard)."""
  names = list(target_flat) + list(file_params)
  for regex in dont_load:
    if not any(re.fullmatch(regex, n) for n in names):
      raise WeightsError(
          f"config.init.dont_load regex {regex!r} matches no parameter of "
          f"the model or of {path} (names look like {names[0]!r}); fix or "
          "remove it.")


def _compare_gelu(file: Optional[bool], model: Optional[bool], report):
  """`file`, `model`: the GELU form (True: tanh) each computes."""
  if model is None:
    return
  if file is None:
    report.gelu = f"model {GELU_NAMES[model]}; the file's origin is unknown"
    return
  report.gelu = (f"model {GELU_NAMES[model]}, file's origin "
                 f"({report.origin}) {GELU_NAMES[file]}")
  if file != model:
    message = (
        f"The weights' origin ({report.origin}) computes GELU with the "
        f"{GELU_NAMES[file]} but the model uses the {GELU_NAMES[model]}: "
        "logits differ slightly (about 1e-4 to 1e-3). Unset "
        "config.model.gelu_approximate to follow the file, or set it to "
        f"{file}.")
    report.warnings.append(message)
    logging.warning(message)


def _warn_zero_head(loaded, report):
  kernel = loaded.get("head/kernel")
  if kernel is not None and not np.any(kernel):
    message = ("The head loaded from the file is all zeros (a checkpoint "
               "saved before its head was trained?): every prediction is "
               "the same until the head is trained.")
    report.warnings.append(message)
    logging.warning(message)


# (what the file has, what the model has, the config that matches the file)
# for the parts a config's options add or remove.
_OPTION_HINTS = (
    (POSEMB, "learned position embeddings", "fixed ones",
     "config.model.posemb=learn"),
    ("cls", "a class token", "none",
     "config.model.class_token=True (or classifier=token)"),
    ("MAPHead_0/probe", "a MAP head", "none", "config.model.classifier=map"),
)
_OPTION_HINTS_REVERSED = (
    (POSEMB, "no position embeddings (fixed sincos2d ones)", "learned ones",
     "config.model.posemb=sincos2d"),
    ("cls", "no class token", "one",
     "config.model.classifier=gap or map (or class_token=False)"),
    ("MAPHead_0/probe", "no MAP head", "one",
     "config.model.classifier=token or gap"),
)


def _hint(file_params, target_flat) -> str:
  """Says when the file is a different model size (e.g. B/16 into L/16),
  or a model with other options (position embeddings, class token, MAP)."""

  def describe(flat):
    kernel = flat.get(PATCH_KERNEL)
    layers = len({
        m.group(1)
        for k in flat
        if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))
    })
    if kernel is None:
      return None
    return f"width {kernel.shape[-1]}, {layers} layers"

  token_mixing = "MixerBlock_0/token_mixing/Dense_0/kernel"
  if token_mixing in file_params and token_mixing in target_flat and (
      file_params[token_mixing].shape != target_flat[token_mixing].shape):
    return (f"An MLP-Mixer's token-mixing weights are sized by its number "
            f"of patches: {file_params[token_mixing].shape[0]} in the file, "
            f"{target_flat[token_mixing].shape[0]} at the config's "
            "resolution. Fine-tune it at the file's resolution, or at K "
            "times it with config.model.mixer_tiles=K (the Mixer paper's "
            "Supplementary C).\n")
  theirs, ours = describe(file_params), describe(target_flat)
  if theirs and ours and theirs != ours:
    return (f"The file is a different model ({theirs}) from the config's "
            f"({ours}).\n")
  hints = [
      f"The file has {has}, the model {other}: set {fix}.\n"
      for name, has, other, fix in _OPTION_HINTS
      if name in file_params and name not in target_flat
  ] + [
      f"The file has {has}, the model {other}: set {fix}.\n"
      for name, has, other, fix in _OPTION_HINTS_REVERSED
      if name not in file_params and name in target_flat
  ]
  return "".join(hints)
