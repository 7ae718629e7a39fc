r"""Masked autoencoders (MAE; He et al. 2021): pre-training, then fine-tuning.

    vit-jax train --config=configs/mae.py:digits --workdir=workdirs/mae
    vit-jax train --config=configs/mae.py:digits_finetune,init=workdirs/mae \
        --workdir=workdirs/mae_ft

75% of each image's patches are dropped, the ViT encodes the rest, and a
light decoder predicts every patch's pixels (normalised per patch); the
loss is on the dropped patches (vit_jax/models/mae.py). Labels are never
read. The checkpoint is a ViT checkpoint plus the decoder, which
fine-tuning, few-shot sweeps and exports leave out. Arguments:

  digits           the `digits` model at 16 px on the built-in digits, on a
                   CPU, at the wall time of configs/selfsup.py:digits (masked
                   patch prediction's); what it reaches against that and
                   random init, few-shot and fine-tuned: docs/selfsup.md.
  digits_finetune  fine-tunes an MAE digits run (`init=WORKDIR`) on the
                   labels at 16 px with layer-wise lr decay, as MAE
                   fine-tunes, at supervised configs/digits.py's length.
  i1k              MAE's ViT-B/16 pre-training on ImageNet-1k (its
                   PRETRAIN.md and the paper's Table 8): 800 epochs at batch
                   4096, AdamW (b2 0.95, weight decay 0.05 on the kernels and
                   tokens, not on biases and norms), lr 1.5e-4 x 4096 / 256
                   = 2.4e-3, 40 warmup epochs then cosine, no clipping,
                   random resized crops of 20-100% of the image and flips,
                   mask ratio 0.75, normalised-pixel loss, a 512-wide
                   8-block decoder, fixed sin-cos position embeddings
                   (a table frozen at MAE's values, which fine-tuning then
                   trains). `init=ViT-B/16@mae-full` (or a workdir)
                   continues MAE's own pre-training, its table loaded.
                   A TPU pod or GPU cluster, days (MAE's ViT-L took 42 h on
                   64 V100s); not run here.
  i1k_finetune     MAE's ViT-B/16 fine-tuning (its FINETUNE.md) from
                   `init=WORKDIR_OR_FILE` (an i1k run, or MAE's released
                   `ViT-B/16@mae`): 100 epochs at batch 1024, AdamW lr 5e-4 x
                   1024 / 256 = 2e-3, layer-wise decay 0.65, weight decay
                   0.05, stochastic depth 0.1, 5 warmup epochs, mixup 0.8,
                   label smoothing 0.1, RandAugment (2, 9), mean pooling.
                   MAE reaches 83.57% (4 seeds) from its 1600-epoch ViT-B.
                   `variant=ViT-L/16` (or H/14) takes MAE's settings for it:
                   base lr 1e-3 (4e-3 at 1024), 50 epochs, stochastic depth
                   0.2 (H: 0.3), layer decay 0.75; MAE's ViT-L reaches
                   85.4-85.5% after 800 epochs. Not run here.

Where ours differs from MAE's: inputs in [-1, 1] rather than ImageNet's
mean and std (the normalised-pixel target does not see the difference),
bilinear rather than bicubic crops, mixup without CutMix and no random
erasing, and the encoder's final LayerNorm kept under the pooling (MAE
replaces it with a new fc_norm). `variant=NAME` picks another ViT (L/16
and H/14: MAE's fine-tuning settings for them, above), `dataset=NAME`
another TFDS dataset; `runlocal` shrinks any preset to a few CPU steps
(what CI runs).
"""

from vit_jax.config import defaults
from vit_jax.errors import UserError

# MAE's fine-tuning by model (its FINETUNE.md): base lr (per 256 images),
# epochs, stochastic depth, layer-wise lr decay.
FINETUNE = {
    "ViT-B/16": (5e-4, 100.0, 0.1, 0.65),
    "ViT-L/16": (1e-3, 50.0, 0.2, 0.75),
    "ViT-H/14": (1e-3, 50.0, 0.3, 0.75),
}
# No weight decay on biases and LayerNorms (MAE's parameter groups).
KERNELS_DECAY = ((".*/bias", 0.0), (".*/scale", 0.0))


def _digits(config):
  config.dataset = "digits"
  config.image_size = 16
  # Digits are not mirror-symmetric: no flip; MAE's masking is the
  # augmentation, with a milder crop than ImageNet's.
  config.pp_train = "inception_crop(0.5)|value_range"
  config.pp_eval = "resize|value_range"
  config.shuffle_buffer = 2_000
  config.cache = True
  config.batch_size = 64
  config.eval_batch_size = 128
  config.model.variant = "digits"
  config.log_every_steps = 500


def _pretrain_digits(config):
  _digits(config)
  config.objective = "mae"
  config.total_steps = 5_400  # masked patch prediction's wall time.
  config.optimizer = "adam"
  config.lr = 1e-3
  config.b2 = 0.95
  config.warmup_steps = 300
  config.weight_decay = 0.05
  config.wd_mults = KERNELS_DECAY
  config.grad_clip_norm = 0.0
  config.mae.decoder_width = 64
  config.mae.decoder_depth = 2
  config.mae.decoder_heads = 4
  config.mae.decoder_mlp_dim = 256
  config.eval_every_steps = 3_000


def _finetune_digits(config, init):
  _digits(config)
  config.total_steps = 2_500
  config.optimizer = "adam"
  config.lr = 3e-3
  config.warmup_steps = 200
  config.weight_decay = 0.05
  config.wd_mults = KERNELS_DECAY
  config.layer_decay = 0.75
  config.model.classifier = "gap"
  config.model.class_token = True
  config.init.checkpoint = init
  config.eval_every_steps = 500


def _imagenet(config, variant, dataset):
  config.dataset = dataset
  config.train_split = "train[:99%]"
  config.eval_split = ("validation"
                       if dataset == "imagenet2012" else "train[99%:]")
  config.image_size = 224
  config.shuffle_buffer = 250_000
  config.model.variant = variant
  config.model.dtype = "bfloat16"
  config.model.gelu_approximate = False  # MAE's (timm's) exact GELU.
  config.optimizer = "adam"
  config.weight_decay = 0.05
  config.wd_mults = KERNELS_DECAY
  config.mu_dtype = "bfloat16"
  config.decay_type = "cosine"
  config.log_every_steps = 100
  config.checkpoint_every_steps = 1_000


def _pretrain_imagenet(config, variant, dataset, init):
  _imagenet(config, variant, dataset)
  config.objective = "mae"
  # MAE's fixed 2D sin-cos position table, kept with the checkpoint (so
  # fine-tuning starts from it and trains it, as MAE's does) and frozen;
  # with `init`, the checkpoint's own table.
  config.model.posemb_init = "sincos"
  config.frozen = ("Transformer/posembed_input/pos_embedding",)
  config.init.checkpoint = init
  config.pp_train = "inception_crop(0.2)|flip_lr|value_range"
  config.pp_eval = "resize_small|central_crop|value_range"
  config.batch_size = 4096
  config.eval_batch_size = 1024
  config.num_epochs = 800.0
  config.warmup_epochs = 40.0
  config.lr = 1.5e-4 * 4096 / 256
  config.b2 = 0.95
  config.grad_clip_norm = 0.0
  config.eval_every_steps = 10_000
  config.keep_checkpoint_every_steps = 50_000


def _finetune_imagenet(config, variant, dataset, init):
  _imagenet(config, variant, dataset)
  config.pp_train = "inception_crop(0.08)|flip_lr|randaug(2,9)|value_range"
  config.pp_eval = "resize_small|central_crop|value_range"
  base_lr, epochs, drop_path, layer_decay = FINETUNE.get(
      variant, FINETUNE["ViT-L/16"])
  config.batch_size = 1024
  config.eval_batch_size = 1024
  config.num_epochs = epochs
  config.warmup_epochs = 5.0
  config.lr = base_lr * 1024 / 256
  config.layer_decay = layer_decay
  config.label_smoothing = 0.1
  config.mixup.alpha = 0.8
  config.model.classifier = "gap"
  config.model.class_token = True
  config.model.drop_path_rate = drop_path
  config.init.checkpoint = init
  config.init.dont_load = ("head/.*",)
  config.eval_every_steps = 2_500


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="digits", variant="ViT-B/16",
                            dataset="imagenet2012", init=None)
  config = defaults.get_config()
  if args.first == "digits":
    _pretrain_digits(config)
  elif args.first == "digits_finetune":
    _finetune_digits(config, args.init)
  elif args.first == "i1k":
    _pretrain_imagenet(config, args.variant, args.dataset, args.init)
  elif args.first == "i1k_finetune":
    _finetune_imagenet(config, args.variant, args.dataset, args.init)
  else:
    raise UserError(f"Unknown MAE preset {args.first!r}; use digits, "
                    "digits_finetune, i1k or i1k_finetune.")
  if args.runlocal:
    defaults.runlocal(config)
    if config.objective == "mae":  # A decoder of the `testing` model's size.
      config.mae.decoder_width = 16
      config.mae.decoder_depth = 1
      config.mae.decoder_heads = 2
      config.mae.decoder_mlp_dim = 32
  return config.lock()
