"""Names of the released ViT checkpoints, and where they lie.

    url_of("ViT-B/16@i21k")  # gs://vit_models/imagenet21k/ViT-B_16.npz

A name is `VARIANT@ORIGIN`, the variant as in `models/variants.py`:

  i21k                 the paper's release, pre-trained on ImageNet-21k
                       (a 21843-class head);
  i21k-ft-i1k          the same, fine-tuned on ImageNet-1k at 384 px;
  i21k-ft-i1k-224      ... at 224 px (ViT-B/16 and ViT-L/16 only);
  augreg-i21k          "How to train your ViT?" (AugReg): the checkpoint
                       google-research/vision_transformer's README recommends
                       for the variant (best ImageNet-1k transfer);
  augreg-i21k-ft-i1k   that checkpoint fine-tuned on ImageNet-1k at 384 px;
  i1k-90ep, -150ep, -300ep
                       big_vision's plain ViT-S/16 baselines (sincos2d, GAP);
  siglip-SIZE, siglip2-SIZE
                       SigLIP / SigLIP 2 image towers (MAP head, no class
                       token), read out of their two-tower files; So400m/14
                       at "384" px has a 27 x 27 grid: image_size 378;
  siglip2-naflex       SigLIP 2's NaFlex image towers (B/16, So400m/16):
                       images at their own shape, a 16 x 16 position
                       table resized to each image's grid (image_size 256);
  flexivit-i1k         FlexiViT S/B/L (patch 16 stored; any patch size);
  i1k, i21k            for Mixer-B/16 and Mixer-L/16: the released MLP-Mixers;
  mim-in22k, mim-in22k-ft-i1k, ...
                       EVA-02 (variants EVA02-*/14), from timm on the
                       Hugging Face Hub, as the RoPE encoders below;
  rope-{axial,mixed}[-ape]-i1k, rope-reg1-gap-sbb-i1k, pe-core,
  dinov3[-qkvb]-lvd1689m
                       Naver's RoPE-ViT, timm's RoPE ViTs, Perception
                       Encoder core and DINOv3 (its licence's terms);
  mae, mae-full, mae-visualize, mae-timm
                       facebookresearch/mae's ViT-B/16, L/16, H/14: the
                       encoder, with its decoder (normalised or plain pixel
                       targets), and timm's copy of the encoder.

Any other AugReg checkpoint is named by its file stem, as in the `filename`
and `adapt_filename` columns of gs://vit_models/augreg/index.csv (e.g.
`B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0`), and lies at
gs://vit_models/augreg/STEM.npz. `vit-jax inspect --list_released` prints
the table.
"""

import dataclasses
import difflib
import re
from typing import Optional

BUCKET = "gs://vit_models"


@dataclasses.dataclass(frozen=True)
class Released:
  url: str
  variant: str  # A name of models/variants.py.
  about: str  # What it was trained on, in a few words.


def _bucket_file(folder: str, variant: str, suffix: str = "") -> str:
  return f"{BUCKET}/{folder}/{variant.replace('/', '_')}{suffix}.npz"


def _original_release() -> dict[str, Released]:
  table = {}
  for variant in ("ViT-B/16", "ViT-B/32", "ViT-L/16", "ViT-L/32", "ViT-H/14",
                  "R50+ViT-B/16", "R50+ViT-L/32"):
    table[f"{variant}@i21k"] = Released(_bucket_file("imagenet21k", variant),
                                        variant, "ImageNet-21k")
  for variant in ("ViT-B/16", "ViT-B/32", "ViT-L/16", "ViT-L/32",
                  "R50+ViT-B/16"):
    table[f"{variant}@i21k-ft-i1k"] = Released(
        _bucket_file("imagenet21k+imagenet2012", variant), variant,
        "ImageNet-21k, fine-tuned on ImageNet-1k at 384 px")
  for variant in ("ViT-B/16", "ViT-L/16"):
    table[f"{variant}@i21k-ft-i1k-224"] = Released(
        _bucket_file("imagenet21k+imagenet2012", variant, "-224"), variant,
        "ImageNet-21k, fine-tuned on ImageNet-1k at 224 px")
  return table


# The README's recommended AugReg run per variant: (variant, the pre-trained
# file's stem, the learning rate of its ImageNet-1k fine-tuning at 384 px).
_AUGREG_RECOMMENDED = (
    ("ViT-L/16", "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
     "0.01"),
    ("ViT-B/16", "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
     "0.03"),
    ("ViT-S/16", "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
     "0.03"),
    ("R50+ViT-L/32",
     "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "0.01"),
    ("R26+ViT-S/32",
     "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "0.01"),
    ("ViT-Ti/16", "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
     "0.03"),
    ("ViT-B/32", "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
     "0.01"),
    ("ViT-S/32", "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0",
     "0.01"),
    ("R+ViT-Ti/16",
     "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "0.03"),
)


def _augreg_recommended() -> dict[str, Released]:
  table = {}
  for variant, stem, lr in _AUGREG_RECOMMENDED:
    table[f"{variant}@augreg-i21k"] = Released(f"{BUCKET}/augreg/{stem}.npz",
                                               variant, "ImageNet-21k (AugReg)")
    table[f"{variant}@augreg-i21k-ft-i1k"] = Released(
        f"{BUCKET}/augreg/{stem}--imagenet2012-steps_20k-lr_{lr}-res_384.npz",
        variant, "ImageNet-21k (AugReg), fine-tuned on ImageNet-1k at 384 px")
  return table


def _big_vision() -> dict[str, Released]:
  """big_vision's public files (its models' VANITY_NAMES): plain ViT
  baselines, SigLIP and SigLIP 2 image towers (two-tower files: the loader
  reads the `img/` tower), FlexiViT (stored at patch 16) and MLP-Mixer."""
  bv = "gs://big_vision"
  table = {
      f"ViT-S/16@i1k-{epochs}ep": Released(
          f"{bv}/vit_s16_i1k_{epochs}ep.npz", "ViT-S/16",
          f"ImageNet-1k, {epochs} epochs (big_vision's plain ViT baseline)")
      for epochs in (90, 150, 300)
  }
  siglip = (("ViT-B/16", "b16", {
      224: "63724782",
      256: "60500360",
      384: "68578854",
      512: "68580893"
  }), ("ViT-L/16", "l16", {
      256: "60552751",
      384: "63634585"
  }), ("ViT-So400m/14", "so400m", {
      224: "57633886",
      384: "58765454"
  }))
  for variant, short, runs in siglip:
    for size, run in runs.items():
      table[f"{variant}@siglip-{size}"] = Released(
          f"{bv}/siglip/webli_en_{short}_{size}_{run}.npz", variant,
          f"SigLIP image tower, WebLI, {size} px")
  siglip2 = (("ViT-B/16", "b16", (224, 256, 384, 512)),
             ("ViT-B/32", "b32", (256,)), ("ViT-L/16", "l16", (256, 384, 512)),
             ("ViT-So400m/14", "so400m14",
              (224, 384)), ("ViT-So400m/16", "so400m16", (256, 384, 512)),
             ("ViT-g-opt/16", "g-opt16", (256, 384)))
  for variant, short, sizes in siglip2:
    for size in sizes:
      table[f"{variant}@siglip2-{size}"] = Released(
          f"{bv}/siglip2/siglip2_{short}_{size}.npz", variant,
          f"SigLIP 2 image tower, WebLI, {size} px")
  for variant, short in (("ViT-B/16", "b16"), ("ViT-So400m/16", "so400m16")):
    table[f"{variant}@siglip2-naflex"] = Released(
        f"{bv}/siglip2/siglip2_{short}_naflex.npz", variant,
        "SigLIP 2 NaFlex image tower, WebLI: images at their own shape "
        "(config.sequence_length; trained at 128 to 1024 patches)")
  for size in ("S", "B", "L"):
    table[f"ViT-{size}/16@flexivit-i1k"] = Released(
        f"{bv}/flexivit/flexivit_{size.lower()}_i1k.npz", f"ViT-{size}/16",
        "FlexiViT, ImageNet-1k (1200 epochs), any patch size at 240 px")
  for size in ("B", "L"):
    for data, folder in (("i1k", "imagenet1k"), ("i21k", "imagenet21k")):
      table[f"Mixer-{size}/16@{data}"] = Released(
          f"gs://mixer_models/{folder}/Mixer-{size}_16.npz", f"Mixer-{size}/16",
          f"MLP-Mixer, ImageNet-{data[1:-1]}k")
  return table


HUB = "https://huggingface.co"


def _timm_hub() -> dict[str, Released]:
  """The RoPE encoders timm serves on the Hugging Face Hub (its
  `timm/MODEL.TAG` repositories, each a `model.safetensors`)."""
  table = {}

  def add(name, variant, model, about):
    table[f"{variant}@{name}"] = Released(
        f"{HUB}/timm/{model}/resolve/main/model.safetensors", variant, about)

  for size, short in (("Ti", "tiny"), ("S", "small"), ("B", "base"), ("L",
                                                                      "large")):
    add("mim-in22k", f"EVA02-{size}/14", f"eva02_{short}_patch14_224.mim_in22k",
        "EVA-02, masked image modelling on ImageNet-22k, 224 px")
    fine_tuned = 336 if size in ("Ti", "S") else 448
    add("mim-in22k-ft-i1k", f"EVA02-{size}/14",
        f"eva02_{short}_patch14_{fine_tuned}.mim_in22k_ft_in1k",
        f"EVA-02 fine-tuned on ImageNet-1k, {fine_tuned} px")
  for size, short in (("B", "base"), ("L", "large")):
    add("mim-in22k-ft-i22k-i1k", f"EVA02-{size}/14",
        f"eva02_{short}_patch14_448.mim_in22k_ft_in22k_in1k",
        "EVA-02 fine-tuned on ImageNet-22k then 1k, 448 px")
  add("mim-m38m", "EVA02-L/14", "eva02_large_patch14_224.mim_m38m",
      "EVA-02, masked image modelling on Merged-38M, 224 px")
  for size, short in (("S", "small"), ("B", "base"), ("L", "large")):
    for form in ("axial", "mixed", "axial-ape", "mixed-ape"):
      function = form.replace("axial", "").replace("-", "_").strip("_")
      add(
          f"rope-{form}-i1k", f"ViT-{size}/16",
          f"vit_{short}_patch16_rope{'_' + function if function else ''}"
          "_224.naver_in1k", f"RoPE-ViT ({form}), ImageNet-1k, 224 px")
    add("dinov3-lvd1689m", f"ViT-{size}/16",
        f"vit_{short}_patch16_dinov3.lvd1689m", "DINOv3, LVD-1689M")
    add("dinov3-qkvb-lvd1689m", f"ViT-{size}/16",
        f"vit_{short}_patch16_dinov3_qkvb.lvd1689m", "DINOv3, LVD-1689M")
  for size, short in (("M", "medium"), ("B", "base")):
    add("rope-reg1-gap-sbb-i1k", f"ViT-{size}/16",
        f"vit_{short}_patch16_rope_reg1_gap_256.sbb_in1k",
        "timm's RoPE ViT, 1 register, ImageNet-1k, 256 px")
  for variant, model in (("ViT-Ti/16", "tiny_patch16_384"),
                         ("ViT-S/16", "small_patch16_384"),
                         ("ViT-B/16", "base_patch16_224"),
                         ("ViT-L/14", "large_patch14_336")):
    add("pe-core", variant, f"vit_pe_core_{model}.fb",
        "Perception Encoder core (its image tower), MetaCLIP data")
  return table


def _mae() -> dict[str, Released]:
  """facebookresearch/mae's ImageNet-1k pre-training (1600 epochs): the
  encoder alone, with its decoder (normalised-pixel targets; `configs/
  mae.py` continues them), with the decoder of pixel targets (for
  reconstructions), and timm's copy of the encoder."""
  mae = "https://dl.fbaipublicfiles.com/mae"
  table = {}
  for variant, short, timm_model in (("ViT-B/16", "base", "base_patch16"),
                                     ("ViT-L/16", "large", "large_patch16"),
                                     ("ViT-H/14", "huge", "huge_patch14")):
    table[f"{variant}@mae"] = Released(
        f"{mae}/pretrain/mae_pretrain_vit_{short}.pth", variant,
        "MAE encoder, ImageNet-1k (1600 epochs)")
    table[f"{variant}@mae-full"] = Released(
        f"{mae}/pretrain/mae_pretrain_vit_{short}_full.pth", variant,
        "MAE encoder and decoder, ImageNet-1k (normalised-pixel targets)")
    table[f"{variant}@mae-visualize"] = Released(
        f"{mae}/visualize/mae_visualize_vit_{short}.pth", variant,
        "MAE encoder and decoder, ImageNet-1k (pixel targets: reconstructions)")
    table[f"{variant}@mae-timm"] = Released(
        f"{HUB}/timm/vit_{timm_model}_224.mae/resolve/main/model.safetensors",
        variant, "MAE encoder, ImageNet-1k (timm's copy)")
  return table


# Name -> checkpoint. Tests add entries (pytest's monkeypatch.setitem).
CHECKPOINTS: dict[str, Released] = {
    **_original_release(),
    **_augreg_recommended(),
    **_big_vision(),
    **_timm_hub(),
    **_mae()
}

# The model part of AugReg file stems (google-research/vision_transformer's
# `configs/models.py` names them so) -> our variant.
AUGREG_MODELS = {
    "Ti_16": "ViT-Ti/16",
    "S_16": "ViT-S/16",
    "S_32": "ViT-S/32",
    "B_8": "ViT-B/8",
    "B_16": "ViT-B/16",
    "B_32": "ViT-B/32",
    "L_16": "ViT-L/16",
    "R_Ti_16": "R+ViT-Ti/16",
    "R26_S_32": "R26+ViT-S/32",
    "R26_B_32": "R26+ViT-B/32",
    "R50_L_32": "R50+ViT-L/32",
}
# MODEL-{i1k|i21k}-..., in the index's safe characters (no '/').
_AUGREG_STEM = re.compile(
    rf"({'|'.join(AUGREG_MODELS)})-(i1k|i21k)-[A-Za-z0-9_.+-]+")


def lookup(name: str) -> Optional[Released]:
  """The checkpoint `name` stands for, None if it names none."""
  if name in CHECKPOINTS:
    return CHECKPOINTS[name]
  stem = name[:-len(".npz")] if name.endswith(".npz") else name
  match = _AUGREG_STEM.fullmatch(stem)
  if match:
    return Released(f"{BUCKET}/augreg/{stem}.npz",
                    AUGREG_MODELS[match.group(1)], "AugReg (by file name)")
  return None


def close_matches(name: str, count: int = 5) -> list[str]:
  """Names of the table like `name` (case and separators aside)."""

  def key(text):
    return re.sub(r"[^a-z0-9@]", "", text.lower())

  keyed = {key(n): n for n in CHECKPOINTS}
  return [
      keyed[k] for k in difflib.get_close_matches(key(name), list(keyed),
                                                  n=count, cutoff=0.6)
  ]


def unknown_name_hint(name: str) -> str:
  """What to say when `name` is neither a path nor a released name; empty
  when it does not look like a name (a missing file is just missing)."""
  matches = close_matches(name)
  if not matches and "@" not in name:
    return ""
  similar = (f" Released checkpoints with similar names: "
             f"{', '.join(matches)}." if matches else "")
  return (f"It is not the name of a released checkpoint either.{similar} "
          "Pass the path of a weights file or Orbax workdir, a URL "
          "(gs://...), or a name from `vit-jax inspect --list_released` "
          "(e.g. ViT-B/16@i21k).")


def describe_table() -> str:
  """Every name with what it was trained on and its URL."""
  width = max(len(n) for n in CHECKPOINTS)
  rows = [
      f"{name:<{width}}  {r.about}\n{'':<{width}}  {r.url}"
      for name, r in CHECKPOINTS.items()
  ]
  return "\n".join(rows + [
      "", "Any AugReg checkpoint is also named by its file stem "
      "(index: gs://vit_models/augreg/index.csv, columns filename and "
      "adapt_filename)."
  ])
