r"""The paper's fine-tuning recipe (App. B.1.1), one preset per dataset.

    vit-jax train --config=configs/finetune.py:cifar10,variant=ViT-B/16 \
        --workdir=workdirs/ft_cifar10 --config.data_dir=~/tensorflow_datasets

SGD with momentum 0.9, batch 512, 500 warmup steps then cosine decay,
global-norm clip 1, no weight decay, a new zero-initialised linear head (no
pre-logits layer), 384 px (higher than pre-training), bf16 compute. Presets
(steps and lr as in the paper's transfer runs; its lr sweep was {0.001,
0.003, 0.01, 0.03}):

  cifar10, cifar100          10k steps, lr 0.03, 2% of train as validation
  imagenet2012               20k steps, lr 0.03 (manual download); also
                             evaluates ImageNet ReaL (`real/accuracy`, from
                             the same manual download) and ImageNet-v2
                             (`v2/accuracy`): two classification entries of
                             config.evals, `real` and `v2`
  oxford_iiit_pet            500 steps, lr 0.003
  oxford_flowers102          500 steps, lr 0.003
  folder                     500 steps; `--config.dataset=folder:/PATH`
  digits                     the built-in digits at 32 px, 800 steps, lr 0.03,
                             from `make demo`'s 16-px model (what it reaches:
                             docs/finetuning.md)

The paper reaches 98-99% on CIFAR-10 and 90-94% on CIFAR-100 with B/16-L/16
pre-trained on ImageNet-21k (Table 5) on a TPUv3-8 in hours; we have not run
these presets at full size. `variant=NAME` picks a model (default ViT-B/16);
`runlocal` shrinks any preset to a few CPU steps (what CI runs).

The weights to start from: `init=PATH` in the argument or
`--config.init.checkpoint=PATH`: an Orbax workdir, a released or big_vision
`.npz`, or timm / Hugging Face weights. Position embeddings are resized to
the new resolution; the head is re-initialised (`config.init.dont_load`).

`family=NAME` sets the model's form that a checkpoint family's files
cannot show (what `vit-jax inspect FILE` names) and the fine-tuning
practice of its papers:

  dinov3    DINOv3's ViT-S/16, B/16, L/16 (timm's vit_*_patch16_dinov3
            files): RoPE and no position table, 4 registers, LayerScale,
            LayerNorm eps 1e-5, no qkv biases (a `_qkvb` file:
            --config.model.qkv_bias=True --config.model.key_bias=False),
            the erf GELU; AdamW (lr 1e-4, weight decay 0.05), layer-wise
            lr decay 0.75 and stochastic depth 0.1, as BEiT, MAE and
            DINOv2 fine-tune. E.g. `cifar10,family=dinov3,variant=ViT-S/16,
            init=vit_small_patch16_dinov3.safetensors`.
  eva02     EVA-02's B/14 and L/14 (timm's eva02_{base,large}_patch14_*
            files; variants EVA02-B/14, EVA02-L/14): axial RoPE (base
            10000, interleaved, scaled to the 16-patch pre-training grid)
            beside a learned table, a query and value bias, SwiGLU MLPs
            with a LayerNorm inside, mean pooling with fc_norm; AdamW (lr
            1e-4, weight decay 0.05), layer-wise lr decay 0.7 (EVA-02's
            for B) and stochastic depth 0.1. Ti/14 and S/14 have no
            LayerNorm in their MLPs: add --config.model.mlp_norm=False.
"""

from vit_jax.config import defaults
from vit_jax.errors import UserError

PRESETS = {
    "cifar10": dict(dataset="cifar10", train_split="train[:98%]",
                    eval_split="test", total_steps=10_000, lr=0.03),
    "cifar100": dict(dataset="cifar100", train_split="train[:98%]",
                     eval_split="test", total_steps=10_000, lr=0.03),
    "imagenet2012": dict(dataset="imagenet2012", train_split="train[:99%]",
                         eval_split="validation", total_steps=20_000, lr=0.03),
    "oxford_iiit_pet": dict(dataset="oxford_iiit_pet", train_split="train",
                            eval_split="test", total_steps=500, lr=0.003),
    "oxford_flowers102": dict(dataset="oxford_flowers102", train_split="train",
                              eval_split="test", total_steps=500, lr=0.003),
    "folder": dict(dataset="folder:/data/images", train_split="train",
                   eval_split="test", total_steps=500, lr=0.003),
    "digits": dict(dataset="digits", train_split="train", eval_split="test",
                   total_steps=800, lr=0.03, image_size=32, batch_size=64,
                   eval_batch_size=128, warmup_steps=20, cache=True,
                   shuffle_buffer=2_000, pp_train="inception_crop(0.5)|"
                   "value_range", pp_eval="resize|value_range"),
}

# family=NAME: (config.model fields, training fields); see the module doc.
FAMILIES = {
    "dinov3": (dict(posemb="none", rope="dinov3", rope_temperature=100.0,
                    num_registers=4, layer_scale=1e-5, layer_norm_eps=1e-5,
                    qkv_bias=False, classifier="gap", class_token=True,
                    gelu_approximate=False, drop_path_rate=0.1),
               dict(optimizer="adam", lr=1e-4, weight_decay=0.05,
                    layer_decay=0.75)),
    "eva02": (
        dict(posemb="learn", rope="axial", rope_temperature=10000.0,
             rope_layout="interleaved", rope_reference_grid=16, key_bias=False,
             swiglu=True, mlp_norm=True, classifier="gap", class_token=True,
             pooled_norm=True, gelu_approximate=False, drop_path_rate=0.1),
        dict(optimizer="adam", lr=1e-4, weight_decay=0.05, layer_decay=0.7)),
}


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="cifar10", variant="ViT-B/16", init=None,
                            family=None)
  if args.first not in PRESETS:
    raise UserError(f"Unknown fine-tuning preset {args.first!r}; use one of "
                    f"{', '.join(PRESETS)}.")
  if args.family is not None and args.family not in FAMILIES:
    raise UserError(f"Unknown checkpoint family {args.family!r}; use one of "
                    f"{', '.join(FAMILIES)}.")
  config = defaults.get_config()
  defaults.paper_transfer(config, args.variant, args.init)
  config.pp_train = "inception_crop|flip_lr|value_range"
  config.pp_eval = "resize|value_range"
  config.shuffle_buffer = 50_000
  config.log_every_steps = 50
  config.eval_every_steps = 1_000
  config.checkpoint_every_steps = 500
  config.update(PRESETS[args.first])
  if args.first == "imagenet2012":  # Same classes: score its head on both.
    config.evals.real = defaults.eval_entry(  # Metrics real/*.
        "classification", skip_unlabelled=True, average_label_sets=True,
        data=dict(dataset="imagenet2012_real", split="validation",
                  label_key="real_label", cache=False))
    config.evals.v2 = defaults.eval_entry(  # Metrics v2/*.
        "classification", skip_unlabelled=False, average_label_sets=False,
        data=dict(dataset="imagenet_v2", split="test", cache=False))
  if args.first == "digits":
    config.model.variant = "digits" if args.variant == "ViT-B/16" else (
        args.variant)
    config.model.dtype = "float32"
    config.eval_every_steps = 100
  if args.family is not None:
    model_fields, training = FAMILIES[args.family]
    config.model.update(model_fields)
    config.update(training)
  if args.runlocal:
    defaults.runlocal(config, image_size=32)
    for name in ("real", "v2"):  # Digits has 10 classes, not ImageNet's.
      if name in config.evals:
        del config.evals[name]
  return config.lock()
