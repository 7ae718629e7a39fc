"""What a weights file holds, and how it loads into a config's model: the
text the `inspect` command prints (`vit_jax/commands/inspect_weights.py`)."""

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.errors import WeightsError
from vit_jax.weights import architecture
from vit_jax.weights import decisions
from vit_jax.weights import loader
from vit_jax.weights import origins
from vit_jax.weights.files import formats


def describe_file(path: str, cache_dir=None, num_heads=None) -> str:
  """The arrays of the file (of the tower it reads, in a two-tower file)
  and the model they are."""
  fmt, tensors = formats.read(path, cache_dir)
  tower = ""
  if fmt == "npz":  # A two-tower file's: the tower read, as loading reads.
    picked, note = origins.tower(tensors, path)
    if note:
      tensors, tower = picked, f" ({note})"
  width = max(len(k) for k in tensors)
  rows = [
      f"{path}: {fmt}, {len(tensors)} arrays, "
      f"{sum(v.size for v in tensors.values()):,} parameters{tower}",
      *describe_model(path, cache_dir, num_heads)
  ]
  rows += [
      f"  {name:<{width}}  {str(tuple(v.shape)):<20} {v.dtype}"
      for name, v in sorted(tensors.items())
  ]
  return "\n".join(rows)


def describe_model(path: str, cache_dir=None, num_heads=None) -> list[str]:
  """Lines saying the model the file holds and the config fields that
  build it (what `predict` and few-shot sweeps use), or why the file alone
  cannot say."""
  try:
    arch, source = architecture.read_with_source(path, num_heads, cache_dir)
  except (UserError, WeightsError) as e:
    return [f"The model: not read from the file alone. {e}"]
  mixer = isinstance(models.get_variant(arch.variant), models.MixerVariant)
  # A FlexiViT run: its workdir's config says the patch size it runs at.
  recorded = loader.recorded_config(path) or {}
  run_patch = recorded["model"]["patch_size"] if recorded else None
  image_size = recorded.get("image_size", arch.image_size)
  name = arch.variant
  if not name.startswith(("ViT", "Mixer")):
    name = f"{'MLP-Mixer' if mixer else 'ViT'} {name}"
  if arch.posemb == "learn":
    size = f"trained at {image_size} px"
  elif recorded:
    size = f"for any size (its run's config: {image_size} px)"
  elif arch.posemb == "none":
    size = f"for any size (no position table; {image_size} px in its config)"
  else:
    size = (f"for any size ({image_size} px in its config, as "
            "big_vision trains)")
  length = recorded.get("sequence_length")
  if arch.sequences or length:
    length = length or (image_size //
                        models.get_variant(arch.variant).stride)**2
    size = (f"{size}, for images at their own shape (up to {length} "
            "patches each by default)")
  where = "; ".join(
      [f"written by {origins.words(source.origin)}", *source.notes])
  sequence_flags = (f" --config.sequence_length={length} "
                    f"--config.pp_eval='{SEQUENCE_PP_EVAL}'" if length else "")
  return [
      f"The model: {name}, {size}, {where}: "
      f"{', '.join(_parts(arch, mixer, run_patch))}.",
      f"Its config: {_flags(arch, mixer, run_patch)} "
      f"--config.image_size={image_size}{sequence_flags}"
  ]


# How images at their own shape are evaluated (inference's default too).
SEQUENCE_PP_EVAL = "resize_to_sequence|value_range|patchify"


def _parts(arch, mixer: bool, run_patch) -> list[str]:
  parts = [f"classifier {arch.classifier}"]
  if mixer:
    parts.append("no position embeddings")
  else:
    parts.append("a class token" if arch.class_token else "no class token")
    parts.append({
        "sincos2d": "fixed sincos2d position embeddings",
        "none": "no position table",
    }.get(arch.posemb, "learned position embeddings"))
  parts.append(f"a {arch.representation_size}-wide pre-logits layer" if arch.
               representation_size else "no pre-logits layer")
  parts.append(f"a head of {arch.num_classes} classes" if arch.
               num_classes else "no head")
  if run_patch:
    parts.append(f"run at patch {run_patch} (its config.model.patch_size)")
  if arch.mixer_tiles != 1:
    parts.append(f"token mixing for {arch.mixer_tiles} x {arch.mixer_tiles} "
                 "tiles")
  return parts + [f"{option}={value}" for option, value in arch.options]


def _flags(arch, mixer: bool, run_patch) -> str:
  """The --config.model flags that build the model, defaults left out."""
  defaults = {"mixer_tiles": 1, "representation_size": None}
  if mixer:  # It has neither.
    defaults.update(class_token=False, posemb="learn")
  fields = {
      k: v
      for k, v in arch.model_fields().items()
      if k not in defaults or v != defaults[k]
  }
  if run_patch:
    fields["patch_size"] = run_patch
  return " ".join(f"--config.model.{k}={v}" for k, v in fields.items())


def compare_with_config(path: str, config, num_classes=None,
                        objective=None) -> str:
  """The loader's report for the model `objective` (the config's
  `objectives.Objective`; None: a plain ViT with a head) trains of
  `config`; raises only for a released name of another variant (before
  downloading it)."""
  loader.check_released_variant(path, config.model.variant)
  config = config.copy_and_resolve_references()
  config.init.checkpoint = path
  config = decisions.decide(config)
  if objective is not None:
    config = objective.decide(config)
  if num_classes is None:
    head = loader.read_converted(
        path,
        models.get_variant(config.model.variant).num_heads,
        config.init.cache_dir).params.get("head/kernel")
    num_classes = head.shape[-1] if head is not None else 1000
  model = (objective.model(config, num_classes) if objective is not None else
           models.build_model(config.model, num_classes))
  size = config.image_size
  target = models.param_shapes(model, size)
  what = (f"{num_classes} classes" if models.vit_of(model).num_classes else
          f"the {objective.name} objective")
  try:
    _, report = loader.load_for_config(config, path, target)
    return (f"Loads into {config.model.variant} at {size} px with "
            f"{what}:\n{report.table(limit=1000)}")
  except WeightsError as e:
    return f"Does NOT load into {config.model.variant} at {size} px:\n{e}"


def report(path: str, config=None, num_classes=None, num_heads=None,
           objective=None) -> str:
  """The file's arrays, then with `config` how they load into the model
  `objective` trains of it (`compare_with_config`). `num_heads`: of a
  PyTorch file (else the width's, or the config's)."""
  if config is None:
    return describe_file(path, num_heads=num_heads)
  # Before `describe_file` downloads a released name.
  loader.check_released_variant(path, config.model.variant)
  num_heads = num_heads or models.get_variant(config.model.variant).num_heads
  return "\n".join([
      describe_file(path, config.init.cache_dir, num_heads),
      compare_with_config(path, config, num_classes, objective)
  ])
