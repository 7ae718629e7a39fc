"""What a weights file holds, and how it loads into a config's model: the
text the `inspect` command prints (`vit_jax/commands/inspect_weights.py`)."""

from vit_jax import models
from vit_jax.errors import WeightsError
from vit_jax.weights import decisions
from vit_jax.weights import formats
from vit_jax.weights import loader


def describe_file(path: str, cache_dir=None) -> str:
  fmt, tensors = formats.read(path, cache_dir)
  width = max(len(k) for k in tensors)
  rows = [
      f"{path}: {fmt}, {len(tensors)} arrays, "
      f"{sum(v.size for v in tensors.values()):,} parameters"
  ]
  rows += [
      f"  {name:<{width}}  {str(tuple(v.shape)):<20} {v.dtype}"
      for name, v in sorted(tensors.items())
  ]
  return "\n".join(rows)


def compare_with_config(path: str, config, num_classes=None) -> str:
  """The loader's report for `config`'s model; raises only for a released
  name of another variant (before downloading it)."""
  loader.check_released_variant(path, config.model.variant)
  config = config.copy_and_resolve_references()
  config.init.checkpoint = path
  config = decisions.decide(config)
  if num_classes is None:
    head = loader.read_converted(
        path,
        models.get_variant(config.model.variant).num_heads,
        config.init.cache_dir).params.get("head/kernel")
    num_classes = head.shape[-1] if head is not None else 1000
  model = models.from_config(config, num_classes)
  size = config.image_size
  target = models.param_shapes(model, size)
  what = (f"{num_classes} classes" if models.vit_of(model).num_classes else
          f"config.objective={config.objective}")
  try:
    _, report = loader.load_for_config(config, path, target)
    return (f"Loads into {config.model.variant} at {size} px with "
            f"{what}:\n{report.table(limit=1000)}")
  except WeightsError as e:
    return f"Does NOT load into {config.model.variant} at {size} px:\n{e}"


def report(path: str, config=None, num_classes=None) -> str:
  """The file's arrays, then with `config` how they load into its model."""
  if config is None:
    return describe_file(path)
  # Before `describe_file` downloads a released name.
  loader.check_released_variant(path, config.model.variant)
  return "\n".join([
      describe_file(path, config.init.cache_dir),
      compare_with_config(path, config, num_classes)
  ])
