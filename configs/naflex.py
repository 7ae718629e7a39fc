r"""Images at their own shape: NaFlex fine-tuning and NaViT pre-training.

    vit-jax train --config=configs/naflex.py:siglip2,dataset=oxford_iiit_pet \
        --workdir=workdirs/naflex_pets --config.data_dir=~/tensorflow_datasets
    vit-jax train --config=configs/naflex.py:navit \
        --workdir=workdirs/navit --config.data_dir=~/tensorflow_datasets

`siglip2` fine-tunes SigLIP 2's NaFlex image tower (`init`, default
ViT-B/16@siglip2-naflex; So400m/16 with variant=ViT-So400m/16,
init=ViT-So400m/16@siglip2-naflex) on `dataset` (a TFDS name or
folder:/PATH): each image at its own aspect ratio, at most `length`
patches (default 256, the tower's 16 x 16 table; it was trained at 128 to
1024), with the crop and flip that keep the aspect ratio, and a new
zero-initialised linear head after its MAP head. Otherwise the paper's
transfer recipe (SGD 0.9, 500 steps, batch 512, cosine, clip 1, bf16) at
lr 0.003. Not run at full size here: what it reaches on `runlocal` and
on digits is in docs/finetuning.md.

`navit` pre-trains ViT-B/16 on ImageNet-1k from scratch as NaViT does
("Patch n' Pack", Dehghani et al. 2023, Sec. 2-3): factorized position
embeddings, a MAP head, each image at a resolution drawn per image (64 to
256 patches), packed into sequences of 1,024 tokens (at most 16 images
each), 20% of each image's patches dropped. Source: those changes on
big_vision's plain ViT-B/16 ImageNet-1k baseline (Adam with decoupled
weight decay, lr 1e-3, weight decay 1e-4, batch 1024, 90 epochs, 10k
warmup steps, RandAugment(2, 10); no mixup: it blends square images).
Target: the plain baseline's accuracy in less compute (the paper reports
matching ViT with about 4x less pre-training compute, on JFT); not run
here (a TPU pod's days).

`runlocal` shrinks either to a few CPU steps of the `testing` model on
the built-in digits, from random weights (what CI runs).
"""

from vit_jax.config import defaults
from vit_jax.errors import UserError

RECIPES = ("siglip2", "navit")
TRAIN_SEQUENCE = "aspect_crop(0.3)|flip_lr|resize_to_sequence|value_range|" + (
    "patchify")
EVAL_SEQUENCE = "resize_to_sequence|value_range|patchify"


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="siglip2", variant=None, init=None,
                            dataset="oxford_iiit_pet", length="256")
  if args.first not in RECIPES:
    raise UserError(f"Unknown recipe {args.first!r}; use one of "
                    f"{', '.join(RECIPES)}.")
  config = defaults.get_config()
  if args.first == "siglip2":
    _siglip2(config, args)
  else:
    _navit(config, args)
  config.model.classifier = "map"
  config.model.class_token = False
  config.pp_eval = EVAL_SEQUENCE
  config.log_every_steps = 50
  if args.runlocal:
    defaults.runlocal(config, image_size=16)
    config.init.checkpoint = None
    config.sequence_length = 16
    config.pp_train = "aspect_crop(0.5)|resize_to_sequence|value_range|" + (
        "patchify")
    config.pp_eval = EVAL_SEQUENCE
    if args.first == "navit":
      config.pp_train = ("aspect_crop(0.5)|resize_to_random_sequence(4)|"
                         "value_range|patchify")
      config.packing.length = 64
      config.packing.sequences = 8
      config.packing.max_images = 8
  return config.lock()


def _siglip2(config, args):
  variant = args.variant or "ViT-B/16"
  defaults.paper_transfer(config, variant, args.init or
                          f"{variant}@siglip2-naflex")
  config.dataset = args.dataset
  config.train_split, config.eval_split = "train", "test"
  config.total_steps, config.lr = 500, 0.003
  config.image_size = 256  # The 16 x 16 position table the tower learned.
  config.sequence_length = int(args.length)
  config.pp_train = TRAIN_SEQUENCE
  config.eval_every_steps = 100


def _navit(config, args):
  config.model.variant = args.variant or "ViT-B/16"
  config.model.posemb = "factorized"
  config.model.dtype = "bfloat16"
  config.dataset = "imagenet2012"
  config.train_split, config.eval_split = "train[:99%]", "validation"
  config.optimizer, config.lr, config.weight_decay = "adam", 1e-3, 1e-4
  config.batch_size = config.eval_batch_size = 1024
  config.num_epochs, config.warmup_steps = 90, 10_000
  config.grad_clip_norm = 1.0
  config.image_size = 256  # The tables' 16 rows and columns at patch 16.
  config.sequence_length = int(args.length)
  config.pp_train = ("aspect_crop(0.08)|flip_lr|randaug(2,10)|"
                     "resize_to_random_sequence(64)|value_range|patchify")
  config.packing.length = 1024
  # 1,024 images of 64 to 256 patches, 20% dropped: 128 patches on average,
  # 128 sequences' worth; 144 leave room (what does not fit is counted).
  config.packing.sequences = 144
  config.packing.max_images = 16
  config.packing.token_drop = 0.2
  config.eval_every_steps = 5_000
