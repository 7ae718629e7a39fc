"""Loading any supported weights file into a model's parameter tree.

    loaded, report = load(path, target, num_prefix_tokens=1, grid=(24, 24))
    params = init_params(config, path, params, params_sharding)  # Training.

`target` is the model's (abstract) parameter tree. The file is read
(`files/`) and converted into this project's names by its origin's room
(`origins.py`); then every target parameter goes through the named steps of
`load_steps.py`: loaded (same shape), resized (position embeddings, by 2D
interpolation, ...), or re-initialised by policy: a head whose number of
classes differs (or that the file lacks), the parts of masked patch
prediction the file lacks or has for another target, and whatever
`dont_load` names. File entries the target has no place for are dropped
only by policy (`load_steps.DROPS`). Anything else (missing, unexpected or
differently shaped parameters) refuses the whole load with the report's
table (`report.py`), or with one line where the file's blocks have other
block options (`config.model.parallel_block`, ...) than the model's:
nothing is half-loaded.

`path` may also be a URL or a released checkpoint's name (`ViT-B/16@i21k`,
see `files/released.py`): it is read from the local cache
(`files/cache.py`), and a name of another variant than the config's is
refused before downloading.
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
from vit_jax.config import model_form
from vit_jax.config import recorded
from vit_jax.errors import WeightsError
from vit_jax.models import scan
from vit_jax.models import variants
from vit_jax.weights import families
from vit_jax.weights import load_steps
from vit_jax.weights import mixer_layout
from vit_jax.weights import origins
from vit_jax.weights import report as reports
from vit_jax.weights.files import directories
from vit_jax.weights.files import formats
from vit_jax.weights.files import released
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.report import Report

_ADVISED = set()  # What `init_params` has said on the console.


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


def read_converted(path: str, num_heads: int, cache_dir=None) -> Converted:
  fmt, tensors = formats.read(path, cache_dir)
  return origins.convert(fmt, tensors, num_heads, path)


def training_workdir(path: str):
  """The workdir an Orbax checkpoint lies in: PATH itself, or what holds
  PATH's `checkpoints/` folder."""
  workdir = paths.resolve(path)
  for parent in [workdir, *workdir.parents]:
    if parent.name == paths.CHECKPOINTS_DIR:
      return parent.parent
  return workdir


def recorded_config(path: str) -> Optional[dict]:
  """The config.json of the workdir an Orbax checkpoint lies in, upgraded
  (`config.recorded`); None if absent."""
  if directories.weights_file(paths.resolve(path)):
    return None  # transformers' or timm's config.json, not a workdir's.
  config_path = training_workdir(path) / paths.CONFIG_FILE
  if not config_path.exists():
    return None
  return recorded.read(config_path)


def origin_gelu(path: str, origin: str) -> Optional[bool]:
  """The GELU form the file's origin computes (True: tanh), None if unknown.

  An Orbax workdir says it in its config.json (one written before the
  option existed computed the exact erf form: `config.recorded`).
  """
  if origin != "orbax":  # A directory's config.json may say otherwise.
    stated = {**name_options(path, origin), **origins.stated_options(path)}
    return stated.get("gelu_approximate",
                      origins.ORIGINS[origin].gelu_approximate)
  run = recorded_config(path)
  if run is None:
    return None
  value = run["model"]["gelu_approximate"]
  return None if value is None else bool(value)


def name_options(path: str, origin: str, cache_dir=None) -> dict:
  """What a file's names say of the options its weights cannot show (a
  timm NaFlexViT's: `origins.Origin.name_options`); {} for most files."""
  if origins.ORIGINS[origin].name_options is None:
    return {}
  return origins.name_options(origin, formats.read_names(path, cache_dir)[1])


def file_origin(path: str, cache_dir=None) -> tuple[str, Optional[bool]]:
  """(origin, the GELU form it computes) of a weights file, reading names
  only."""
  fmt, names = formats.read_names(path, cache_dir)
  origin = origins.detect(fmt, names, path)
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
  form = models.form_of(config.model)
  return load(path, params, num_prefix_tokens=form.posemb_prefix_tokens,
              grid=target_grid(config), dont_load=config.init.dont_load,
              resize_method=config.init.posemb_resize,
              source_grid=config.init.source_grid,
              gelu_approximate=form.gelu_approximate,
              posemb_interpolation=form.posemb_interpolation,
              quick_gelu=form.quick_gelu, cache_dir=config.init.cache_dir,
              model_options=dataclasses.asdict(form))


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
  for advice in report.advice:
    if advice not in _ADVISED:  # Once a process, whatever loads it again.
      _ADVISED.add(advice)
      console.say("%s", advice)
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
         gelu_approximate: Optional[bool] = None,
         posemb_interpolation: Optional[str] = None,
         quick_gelu: Optional[bool] = None, cache_dir=None,
         model_options: Optional[dict] = None):
  """Returns ({name: array} of what was loaded, Report); raises WeightsError.

  `target`: the model's parameter tree (arrays or ShapeDtypeStructs) in the
  looped form (`models.scan.unstack_layers` for a scanned one).
  `num_prefix_tokens`: tokens before the patch grid in the target (1 with a
  class token, else 0). `grid`: the target's (H, W) token grid.
  `gelu_approximate`, `quick_gelu`: the model's activation, compared with
  what the file's origin computes (and what a CLIP file cannot say).
  `posemb_interpolation`: how the model reads a NaFlex file's table on
  images at their own shape (None: as the file says); its table resized to
  `grid` is resized so.
  `cache_dir`: where a file at a URL or by released name is kept (None: the
  default of `cache.cache_root`). `model_options`: the model's form
  (config.model's fields), compared with what the file's family computes
  that no parameter shows (`_check_family_options`).
  """
  target_flat = flax.traverse_util.flatten_dict(target, sep="/")
  _check_family(path, target_flat, cache_dir)
  source = read_converted(path, _num_heads(target_flat), cache_dir)
  _check_family_options(path, source, model_options)
  report = Report(path=path, origin=source.origin, notes=list(source.notes))
  if POSEMB not in source.params and POSEMB not in target_flat:
    none = model_options is not None and model_options["posemb"] == "none"
    report.notes.append(
        "position embeddings: none (RoPE, or no position information)"
        if none else "position embeddings: fixed 2D sin-cos (sincos2d), "
        "none stored")
  _check_dont_load(dont_load, target_flat, source.params, path)
  reports.compare_gelu(origin_gelu(path, source.origin), gelu_approximate,
                       report)
  reports.advise_activation(path, source.params, {
      **source.options,
      **origins.stated_options(path)
  }, quick_gelu, report)
  policy = load_steps.Target(
      num_prefix_tokens, tuple(grid), resize_method,
      tuple(source_grid) if source_grid else None, tuple(dont_load),
      has_head=any(k.startswith("head/") for k in target_flat),
      sequence_interpolation=posemb_interpolation)
  loaded = {}
  for name, leaf in target_flat.items():
    outcome = load_steps.outcome(name, source.params.get(name), tuple(
        leaf.shape), source, policy)
    getattr(report, outcome.kind).append(outcome.row)
    if outcome.value is not None:
      loaded[name] = outcome.value
  for name in source.params:
    if name not in target_flat:
      why = load_steps.why_dropped(name, policy)
      if why is None:
        report.unexpected.append(name)
      else:
        report.dropped.append((name, why))
  reports.warn_zero_head(loaded, report)
  if not report.ok:
    _refuse(path, source.params, target_flat, report)
  loaded = {
      k: np.asarray(v, dtype=target_flat[k].dtype) for k, v in loaded.items()
  }
  return loaded, report


def _check_family_options(path, source: Converted, model_options):
  """Refuses, in one line with the flags, a model that would compute
  otherwise with the file's weights than the file's family does (a value
  of a field no parameter shows: `model_form.stated_fields`), as its
  directory's config.json says it where it does (over the family's)."""
  if model_options is None:
    return
  stated = model_form.stated_fields()
  said = {**source.options, **origins.stated_options(path)}
  theirs = {
      k: v for k, v in said.items() if k in stated and model_options[k] != v and
      not (k == "map_heads" and model_options["classifier"] != "map")
  }  # A model that pools otherwise has no MAP head to match.
  if theirs:
    ours = ", ".join(f"{k}={model_options[k]}" for k in theirs)
    needed = ", ".join(f"{k}={v}" for k, v in theirs.items())
    raise WeightsError(
        f"{path} is computed with {needed} (its family's form, which no "
        f"parameter shows), but the model has {ours}: set "
        f"{families.config_fix(theirs)}.")


def _refuse(path, file_params, target_flat, report):
  """The whole load refused: one line where only the block options differ,
  else the report's table with what the file is."""
  other_block = families.other_block(path, file_params, target_flat)
  if other_block and all(
      families.BLOCK_OPTION_NAMES.search(name)
      for name in report.missing + report.unexpected +
      [m[0] for m in report.mismatched]):  # Nothing else differs.
    raise WeightsError(other_block)
  raise WeightsError(
      f"{path} does not fit this model; nothing was loaded.\n"
      f"{report.table()}\n{other_block + chr(10) if other_block else ''}"
      f"{reports.hint(file_params, target_flat)}Name the "
      "parameters to re-initialise (and file entries to ignore) in "
      "config.init.dont_load, or pick the config.model that wrote the file.")


def _check_dont_load(dont_load, target_flat, file_params, path):
  """Each regex must name a model parameter or a file entry (typo guard)."""
  names = list(target_flat) + list(file_params)
  for regex in dont_load:
    if not any(re.fullmatch(regex, n) for n in names):
      raise WeightsError(
          f"config.init.dont_load regex {regex!r} matches no parameter of "
          f"the model or of {path} (names look like {names[0]!r}); fix or "
          "remove it.")
