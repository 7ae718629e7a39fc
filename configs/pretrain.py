r"""Pre-training recipes: the paper's (Dosovitskiy et al. 2021, App. B.1,
Table 3) and AugReg's ("How to train your ViT", Steiner et al. 2021).

    vit-jax train --config=configs/pretrain.py:i1k,variant=ViT-B/16 \
        --workdir=gs://BUCKET/vit_b16_i1k --config.data_dir=gs://BUCKET/tfds

Adam (b1 0.9, b2 0.999), batch 4096, 10k-step linear warmup then linear
decay, global-norm clip 1, high decoupled weight decay, dropout 0.1, a tanh
pre-logits layer as wide as the encoder, 224 px, bf16 compute. Arguments:

  i1k   ImageNet-1k (TFDS imagenet2012, manual download), 300 epochs, lr 3e-3
        with cosine decay, weight decay 0.3; 1% of train held out as
        minival. The paper reports about 78% ImageNet top-1 for ViT-B/16
        after fine-tuning at 384 px (Table 5).
  i21k  ImageNet-21k from an image folder (`--config.dataset=folder:/PATH`:
        TFDS has no builder for it), 90 epochs, lr 1e-3 with linear decay,
        weight decay 0.03, sigmoid cross-entropy; 1% held out. The paper
        fine-tunes this ViT-B/16 to about 84% on ImageNet (Table 5).
  augreg_i1k, augreg_i21k
        AugReg as big_vision's public configs/vit_i1k.py and vit_i21k.py:
        Adam lr 1e-3, weight decay 1e-4 on kernels (big_vision's wd, not
        scaled by the lr: config.weight_decay=0.1 here, which is), 10k
        warmup, cosine, 300 epochs, batch 4096, sigmoid cross-entropy with
        the head bias at -6.9 (i1k) or -10 (i21k); i1k keeps the tanh
        pre-logits and class token, i21k pools by GAP. `aug=SETTING` picks
        RandAugment and mixup (default: big_vision's choice for the model):

          setting  none  light1  light2  medium1  medium2  strong1  strong2
          randaug  -     (2,0)   (2,10)  (2,15)   (2,15)   (2,20)   (2,20)
          mixup    -     -       0.2     0.2      0.5      0.5      0.8

        (mixup's number is the Beta concentration, every batch mixed, as
        big_vision's `mixup.p`). `reg=0.1` adds dropout and stochastic depth
        0.1, the `do_0.1-sd_0.1` of the released AugReg names (default 0).

  plain_i1k
        big_vision's "Better plain ViT baselines" (Beyer et al. 2022,
        configs/vit_s16_i1k.py): ViT-S/16 by default with fixed sincos2d
        position embeddings, no class token, global average pooling and a
        tanh pre-logits layer; batch 1024, Adam lr 1e-3, weight decay 1e-4
        on kernels (config.weight_decay=0.1 here, scaled by the lr), 10k
        warmup, cosine, RandAugment(2,10), mixup 0.2, no dropout, softmax
        cross-entropy, 1% of train as minival. `epochs=90` (default) or
        `epochs=300`: the report's 76.5% and about 80% ImageNet top-1,
        90 epochs in 6-7 h on a TPU v3-8 (300: about 3.3 times that).

  mixer_i1k
        big_vision's MLP-Mixer recipe (configs/mlp_mixer_i1k.py): Mixer-B/16
        by default, 300 epochs, batch 4096, Adam lr 1e-3 with 10k warmup and
        linear decay (to 0 here, to 1e-5 there), weight decay 1e-4 on
        kernels (0.1 here), RandAugment(2,15), mixup 0.5, stochastic depth
        0.1, sigmoid cross-entropy with the head bias at -6.9; no pre-logits
        layer. big_vision states 76.3% top-1 in 2 h 11 min on a TPU v3-128
        (60 epochs: 70.5% in 27 min).

  flexi_i21k
        FlexiViT (Beyer et al. 2023; big_vision's proj/flexivit/i21k_sup.py,
        which big_vision gives for reference and never ran publicly): a
        ViT-B whose parameters are stored at patch 32 (position embeddings
        on its 7 x 7 grid of 240 px), each step at a patch size drawn from
        48, 40, 30, 24, 20, 16, 15, 12, 10 and 8 (config.flexi), evaluated
        at each; 240 px, 90 epochs, class token, no pre-logits, Adam lr 1e-3,
        weight decay 1e-4 on kernels, RandAugment(2,10), mixup 0.2, sigmoid
        cross-entropy with the head bias at -10. It runs and evaluates at
        patch 16 by default (config.model.patch_size).

`fewshot=standard` (any recipe) also runs big_vision's standard few-shot
set every 10k steps (configs/fewshot.py:standard; it reads ImageNet too).

Hardware: a TPU pod slice or GPU cluster (the paper: TPUv3, days for B/16).
We have not run the full recipes; the figures above are the paper's.

`variant=NAME` picks a model (default ViT-B/16); `runlocal` shrinks
everything to a few CPU steps on the built-in digits (what CI runs).
On pods, shard the parameters with `--config.sharding.params="(('.*',
'fsdp'),)"` for L and H models.
"""

from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.fewshot import bundles
from vit_jax.models import variants

RECIPES = {
    "i1k": dict(dataset="imagenet2012", num_epochs=300.0, lr=3e-3,
                decay_type="cosine", weight_decay=0.3, loss="softmax_xent"),
    # Sigmoid over 21k classes starts near the labels' prior (big_vision).
    "i21k": dict(dataset="folder:/data/imagenet21k", num_epochs=90.0, lr=1e-3,
                 decay_type="linear", weight_decay=0.03, loss="sigmoid_xent",
                 model=dict(head_bias_init=-10.0)),
}
_AUGREG = dict(num_epochs=300.0, lr=1e-3, decay_type="cosine", weight_decay=0.1,
               wd_mults=((".*/kernel", 1.0), (".*", 0.0)), loss="sigmoid_xent")
RECIPES["augreg_i1k"] = dict(_AUGREG, dataset="imagenet2012",
                             model=dict(head_bias_init=-6.9))
RECIPES["plain_i1k"] = dict(
    dataset="imagenet2012", num_epochs=90.0, lr=1e-3, decay_type="cosine",
    weight_decay=0.1, wd_mults=((".*/kernel", 1.0), (".*", 0.0)),
    loss="softmax_xent", batch_size=1024, eval_batch_size=1024,
    pp_train="inception_crop|flip_lr|randaug(2,10)|value_range", model=dict(
        classifier="gap", posemb="sincos2d", dropout_rate=0.0))
PLAIN_EPOCHS = ("90", "300")  # The report's two lengths.
RECIPES["mixer_i1k"] = dict(
    dataset="imagenet2012", num_epochs=300.0, lr=1e-3, decay_type="linear",
    weight_decay=0.1, wd_mults=((".*/kernel", 1.0), (".*", 0.0)),
    loss="sigmoid_xent",
    pp_train="inception_crop|flip_lr|randaug(2,15)|value_range", model=dict(
        classifier="gap", head_bias_init=-6.9, dropout_rate=0.0,
        drop_path_rate=0.1))
# FlexiViT's patch sizes at 240 px (its grids 5 ... 30).
FLEXI_PATCH_SIZES = (48, 40, 30, 24, 20, 16, 15, 12, 10, 8)
RECIPES["flexi_i21k"] = dict(
    dataset="folder:/data/imagenet21k", num_epochs=90.0, lr=1e-3,
    decay_type="cosine", weight_decay=0.1,
    wd_mults=((".*/kernel", 1.0), (".*", 0.0)), loss="sigmoid_xent",
    image_size=240, pp_train="inception_crop|flip_lr|randaug(2,10)|value_range",
    model=dict(head_bias_init=-10.0, dropout_rate=0.0,
               patch_size=16), flexi=dict(patch_sizes=FLEXI_PATCH_SIZES))
# The recipes' mixup: (Beta concentration, share of batches mixed).
MIXUP = {
    "plain_i1k": (0.2, 1.0),
    "mixer_i1k": (0.5, 1.0),
    "flexi_i21k": (0.2, 1.0)
}
DEFAULT_VARIANT = {
    "plain_i1k": "ViT-S/16",
    "mixer_i1k": "Mixer-B/16",
    "flexi_i21k": "ViT-B/32"
}
NO_PRE_LOGITS = ("mixer_i1k", "flexi_i21k")
RECIPES["augreg_i21k"] = dict(
    _AUGREG, dataset="folder:/data/imagenet21k", model=dict(
        head_bias_init=-10.0, classifier="gap"))

# AugReg setting -> (RandAugment magnitude or None, mixup concentration).
AUG_SETTINGS = {
    "none": (None, 0.0),
    "light1": (0, 0.0),
    "light2": (10, 0.2),
    "medium1": (15, 0.2),
    "medium2": (15, 0.5),
    "strong1": (20, 0.5),
    "strong2": (20, 0.8)
}
# big_vision's default setting per model (vit_i1k.py / vit_i21k.py).
DEFAULT_AUG = {
    "augreg_i1k": {
        "ViT-Ti/16": "light1",
        "ViT-S/32": "medium1",
        "ViT-S/16": "medium2",
        "ViT-B/32": "medium2",
        "ViT-B/16": "medium2",
        "ViT-L/16": "medium2"
    },
    "augreg_i21k": {
        "ViT-Ti/16": "none",
        "ViT-S/32": "none",
        "ViT-S/16": "light1",
        "ViT-B/32": "light2",
        "ViT-B/16": "light2",
        "ViT-L/16": "medium2"
    },
}


def _augreg(config, recipe: str, args):
  """RandAugment, mixup and (with `reg`) dropout and stochastic depth."""
  setting = args.aug or DEFAULT_AUG[recipe].get(args.variant)
  if setting is None:
    raise UserError(f"big_vision's {recipe} has no default augmentation for "
                    f"{args.variant}; choose one with aug= (one of "
                    f"{', '.join(AUG_SETTINGS)}).")
  if setting not in AUG_SETTINGS:
    raise UserError(f"Unknown AugReg setting aug={setting!r}; use one of "
                    f"{', '.join(AUG_SETTINGS)}.")
  magnitude, mixup_alpha = AUG_SETTINGS[setting]
  if magnitude is not None:
    config.pp_train = ("inception_crop|flip_lr|"
                       f"randaug(2,{magnitude})|value_range")
  config.mixup.alpha, config.mixup.p = mixup_alpha, 1.0
  reg = float(args.reg or 0.0)
  config.model.dropout_rate = reg
  config.model.drop_path_rate = reg
  if recipe == "augreg_i21k":
    config.model.representation_size = None


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="i1k", variant=None, aug=None, reg=None,
                            fewshot=None, epochs=None)
  args.variant = args.variant or DEFAULT_VARIANT.get(args.first, "ViT-B/16")
  if args.first not in RECIPES:
    raise UserError(f"Unknown pre-training recipe {args.first!r}; use one of "
                    f"{', '.join(RECIPES)}.")
  if (args.aug or args.reg) and not args.first.startswith("augreg"):
    raise UserError("aug= and reg= belong to the AugReg recipes "
                    "(augreg_i1k, augreg_i21k).")
  if args.epochs is not None and (args.first != "plain_i1k" or
                                  args.epochs not in PLAIN_EPOCHS):
    raise UserError(f"epochs={args.epochs}: only plain_i1k takes epochs=, "
                    f"one of {', '.join(PLAIN_EPOCHS)}.")
  config = defaults.get_config()
  config.train_split = "train[:99%]"
  config.eval_split = "train[99%:]"  # The paper's minival.
  config.image_size = 224
  config.pp_train = "inception_crop|flip_lr|value_range"
  config.pp_eval = "resize_small|central_crop|value_range"
  config.shuffle_buffer = 250_000
  config.batch_size = 4096
  config.eval_batch_size = 4096
  config.model.dropout_rate = 0.1
  config.update(RECIPES[args.first])
  if args.epochs:
    config.num_epochs = float(args.epochs)
  config.optimizer = "adam"
  config.b1, config.b2 = 0.9, 0.999
  config.warmup_steps = 10_000
  config.grad_clip_norm = 1.0
  config.mu_dtype = "bfloat16"  # Halves the first moment's memory.
  config.model.variant = args.variant
  # The pre-training MLP head: a tanh layer as wide as the encoder (the
  # Mixer's and FlexiViT's recipes have none).
  if args.first not in NO_PRE_LOGITS:
    config.model.representation_size = variants.get_variant(
        args.variant).hidden_size
  config.model.dtype = "bfloat16"
  config.log_every_steps = 100
  config.eval_every_steps = 5_000
  config.checkpoint_every_steps = 1_000
  config.keep_checkpoint_every_steps = 50_000
  if args.first.startswith("augreg"):
    _augreg(config, args.first, args)
  if args.first in MIXUP:  # big_vision's mixup=dict(p=ALPHA): every batch.
    config.mixup.alpha, config.mixup.p = MIXUP[args.first]
  if args.fewshot not in (None, "standard"):
    raise UserError(f"fewshot={args.fewshot!r}: the only few-shot set is "
                    "'standard'.")
  if args.fewshot:
    bundles.use_standard(config, every_steps=10_000)
  if args.runlocal:
    pp_train = config.pp_train
    defaults.runlocal(config)
    if args.first == "mixer_i1k":
      config.model.variant = "testing-mixer"
    if args.first == "flexi_i21k":  # Stored at patch 4; runs at 4 and 8.
      config.model.patch_size, config.flexi.patch_sizes = 4, (4, 8)
    if "randaug" in pp_train:  # Keep the recipe's regularisers.
      config.pp_train = "inception_crop(0.5)|randaug(2,10)|value_range"
    config.loss = "softmax_xent"
    config.model.head_bias_init = 0.0
    if config.model.representation_size is not None:
      config.model.representation_size = 16
    if args.fewshot:
      config.evals.fewshot.datasets, config.evals.fewshot.data.pp = ((
          "digits",), None)
      config.evals.fewshot.every_steps = 5
      config.fewshot.shots, config.fewshot.seeds = (1, 2), 1
  return config.lock()
