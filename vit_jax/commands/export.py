"""The export command: a model's weights for other code bases, from any
readable file or workdir.

    vit-jax export --checkpoint=workdirs/demo/pretrain \
        --format=npz --out=/tmp/digits.npz
    vit-jax export --checkpoint=workdirs/demo/finetune \
        --format=hf --out=/tmp/digits-hf        # transformers loads it
    vit-jax export --checkpoint=workdirs/demo/finetune \
        --format=timm-dir --out=/tmp/digits-timm  # timm loads it

(or `python -m vit_jax export ...`). `npz` is the released
google-research/vision_transformer layout, which its code and this project
load; `timm` a safetensors file with the state dict of timm's
`VisionTransformer` or `MlpMixer` (`vit_jax/weights/writers.py`). The two
directory formats are what those libraries load by themselves, with their
config and the evaluation preprocessing: `hf`, transformers'
ViTForImageClassification / ViTModel (`weights/transformers/hf_dir.py`),
and `timm-dir`, `timm.create_model("local-dir:DIR", pretrained=True)`
(`weights/timm/timm_dir.py`).
An image-text model (SigLIP, CLIP, LiT: a run's workdir, a two-tower
file or a transformers SiglipModel directory) exports whole: `npz` is then
big_vision's two-tower file (`params/img/...`, `params/txt/...`, `t`,
`b`), which its SigLIP code and this project load, and `hf` transformers'
SiglipModel (`weights/transformers/hf_siglip.py`).
A model one format cannot hold is refused in one line that names a format
that can (each writer writes the fields of the form whose facts name it:
`weights/exports.py`); what an `npz` or `timm` file cannot show is said
as the flags that load it. Imports no TensorFlow unless class names are
read from a dataset.
"""

from absl import flags
import flax
import jax
import numpy as np

from vit_jax import cli
from vit_jax import console
from vit_jax import inference
from vit_jax import paths
from vit_jax import weights
from vit_jax.config.model_form import ModelForm
from vit_jax.errors import UserError
from vit_jax.inference import zero_shot
from vit_jax.models import scan

DIRECTORY_FORMATS = ("hf", "timm-dir")

cli.define_checkpoint_flags("to export")
flags.DEFINE_enum("format", "npz", weights.EXPORT_FORMATS + DIRECTORY_FORMATS,
                  "Layout to write.")
flags.DEFINE_string("out", None,
                    "File to write (npz, timm) or directory (hf, timm-dir).")
flags.DEFINE_string(
    "labels", None, "hf, timm-dir: a file of class names, one per line (else "
    "the training dataset's, ImageNet's for 1,000 classes, or none).")
flags.DEFINE_string(
    "pp_eval", None, "hf, timm-dir: the evaluation preprocessing to write "
    "(default: the config's).")
flags.mark_flags_as_required(["out"])


def _say_left_out(left_out):
  if left_out:
    console.say(
        "Left out the self-supervised objective's parts (masked patch "
        "prediction's [mask] token and head, MAE's decoder; %d arrays): the "
        "other code base's model has no place for them.", len(left_out))


def export_file(checkpoint: str, fmt: str, out: str, config=None,
                num_heads=None) -> str:
  """Writes `checkpoint` as one file (npz, timm) at `out`: its parameters,
  the model's form checked against what the format writes
  (`weights.exports`), and what the file cannot show said as the flags that
  load it. Returns the line that says what was written."""
  form, source = weights.form_alone(checkpoint, num_heads)
  params = (weights.released_params(checkpoint, num_heads or 0)
            if source is None else weights.with_class_token_entry(
                source.params, source.posemb_prefix_tokens))
  if config is not None:
    form = ModelForm.from_config(
        weights.config_for(checkpoint, config, None, num_heads)[0].model)
  mixer = weights.is_mixer(params)
  if fmt == "timm":
    weights.refuse_unwritten(form, weights.exporter_of(fmt, form, mixer), mixer)
  console.say("Writing %s to %s as %s.", checkpoint, out, fmt)
  save = {"npz": weights.save_npz, "timm": weights.save_timm}[fmt]
  left_out = save(params, out) or []
  _say_left_out(left_out)
  written = {k: v for k, v in params.items() if k not in left_out}
  count = sum(v.size for v in written.values())
  line = f"Wrote {len(written)} arrays ({count:,} parameters) to {out}."
  unsaid = weights.unsaid(weights.form_alone(out, num_heads)[0], form)
  if unsaid:  # hf and timm-dir write the model as it ran.
    line += (" The file cannot say all the model computes: load it with " +
             " ".join(f"--config.model.{k}={v}" for k, v in unsaid.items()) +
             " (or export --format=hf or timm-dir).")
  return line


def export_directory(checkpoint: str, fmt: str, out: str, config=None,
                     image_size=None, num_heads=None, labels: str = None,
                     pp_eval: str = None) -> str:
  """Writes `checkpoint` as a `fmt` directory (hf, timm-dir) at `out`: the
  model `predict` would apply (`inference.load`: config, resolution, GELU
  decided), with its class names. Returns the line that says what was
  written."""
  loaded = inference.load(checkpoint, config, image_size, num_heads)
  pp = weights.eval_preprocessing_of(pp_eval or loaded.config.pp_eval,
                                     loaded.config.image_size)
  flat = flax.traverse_util.flatten_dict(jax.device_get(loaded.params), sep="/")
  flat = scan.unstack_flat(flat) if scan.is_scanned(loaded.params) else flat
  # The plain model: self-supervised objectives' parts were left out loading.
  params = {k: np.asarray(v, np.float32) for k, v in flat.items()}
  run_patch = loaded.config.model.patch_size
  if run_patch:  # FlexiViT: the other libraries' models run what they store.
    params = weights.at_patch_size(params, run_patch, loaded.config.image_size)
  names, source = None, None
  if loaded.num_classes:
    names, source = inference.class_names(loaded, labels)
    names = None if source == "class indices" else names
  console.say("Writing %s to %s as %s.", checkpoint, out, fmt)
  if fmt == "timm-dir":  # Images at their own shape: timm's NaFlexViT.
    weights.write_timm_dir(out, params, loaded.config.model,
                           loaded.config.image_size, pp, names, naflex=bool(
                               loaded.config.sequence_length))
  else:
    weights.write_hf_dir(out, params, loaded.config.model,
                         loaded.config.image_size, pp, names)
  count = sum(v.size for v in params.values())
  return (f"Wrote {out} ({count:,} parameters"
          f"{', class names from ' + source if names else ''}).")


def export_two_towers(checkpoint: str, fmt: str, out: str) -> str:
  """Writes an image-text model whole: big_vision's two-tower .npz or
  transformers' SiglipModel directory. Returns the line saying so."""
  if fmt not in ("npz", "hf"):
    raise UserError(f"{checkpoint} is an image-text model (two towers); "
                    f"{fmt} holds one image model: use --format=npz "
                    "(big_vision's two-tower file) or --format=hf "
                    "(transformers' SiglipModel).")
  loaded = zero_shot.load(checkpoint, need_tokenizer=False)
  params = zero_shot.flat_params(loaded)
  console.say("Writing %s to %s as %s.", checkpoint, out,
              "big_vision's two-tower file" if fmt == "npz" else "SiglipModel")
  if fmt == "npz":
    weights.save_npz(
        weights.as_big_vision_file(params, naflex=bool(
            loaded.config.sequence_length)), out)
  else:
    from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
    state, config = weights.to_siglip(
        params, loaded.config.model, loaded.config.text,
        loaded.config.image_size, naflex=bool(loaded.config.sequence_length))
    pp = weights.eval_preprocessing_of(loaded.config.pp_eval,
                                       loaded.config.image_size)
    weights.write_hf_files(out, config,
                           st_numpy.save(state, metadata={"format": "pt"}), pp)
  count = sum(v.size for v in params.values())
  return f"Wrote {out} ({len(params)} arrays, {count:,} parameters)."


def _check_out(fmt: str, out: str):
  """--out fits --format, before the checkpoint is read."""
  path = paths.resolve(out)
  if fmt in DIRECTORY_FORMATS and path.exists() and not path.is_dir():
    raise UserError(f"--out={out} is an existing file, and --format={fmt} "
                    "writes a directory; give a new path, or a directory "
                    "(its files of the same names are replaced).")
  if fmt not in DIRECTORY_FORMATS and path.is_dir():
    raise UserError(
        f"--out={out} is a directory, and --format={fmt} writes "
        "one file; give the file's path, e.g. "
        f"{out.rstrip('/')}/model.{'npz' if fmt == 'npz' else 'safetensors'}.")


def main(argv):
  del argv
  f = flags.FLAGS
  _check_out(f.format, f.out)
  console.say("Reading %s.", f.checkpoint)  # Big files take a while.
  if zero_shot.is_two_towers(f.checkpoint):
    print(export_two_towers(f.checkpoint, f.format, f.out))
  elif f.format in DIRECTORY_FORMATS:
    print(
        export_directory(f.checkpoint, f.format, f.out, f.config, f.image_size,
                         f.num_heads, f.labels, f.pp_eval))
  else:
    print(export_file(f.checkpoint, f.format, f.out, f.config, f.num_heads))


if __name__ == "__main__":
  cli.run(main)
