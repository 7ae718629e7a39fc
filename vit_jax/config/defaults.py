"""Every config field, declared once with its default and what it means.

Config files (configs/*.py, or a user's own anywhere on disk) start from
`vit_jax.config.defaults.get_config()` and override fields; code reads
`config.field` directly. The returned config is locked, so a misspelt
`--config.field=value` override is an error rather than a silent no-op.
"""

import ml_collections
from ml_collections import config_dict

from vit_jax.config import model_form
from vit_jax.errors import UserError


def get_model_config() -> ml_collections.ConfigDict:
  model = ml_collections.ConfigDict()
  model.variant = "ViT-B/16"  # A name from vit_jax/models/variants.py.
  # Every other field: the model's form (vit_jax/config/model_form.py), each
  # declared there once with its default and meaning.
  for name, value in model_form.config_fields().items():
    model[name] = value
  return model


def get_config(arg=None) -> ml_collections.ConfigDict:
  del arg
  config = ml_collections.ConfigDict()
  config.seed = 0  # Seeds parameter init, dropout and the data order.
  # Modules of the user's that register preprocessing ops or evaluator types
  # (vit_jax/config/imports.py): module names, or paths of .py files.
  config.imports = ()  # See above.

  # Data.
  # A TFDS name ('digits' is built in, no download) or 'folder:/path/to/root'
  # for images in ROOT/{train,test}/CLASS_NAME/*.{jpg,jpeg,png}.
  config.dataset = "digits"  # See above.
  config.data_dir = config_dict.placeholder(str)  # TFDS data_dir, or default.
  config.manual_dir = config_dict.placeholder(str)  # TFDS manual downloads.
  config.train_split = "train"  # TFDS split string, e.g. 'train[:98%]'.
  config.eval_split = "test"  # Split for periodic and final evaluation.
  config.image_size = 224  # Square input resolution in pixels.
  # Images at their own shape (NaFlex): patches per image where a pipeline
  # ends with patchify (e.g. "resize_to_sequence|value_range|patchify":
  # each image resized, aspect kept, to the most patches within it, and
  # padded to it). image_size then sizes the model's position embeddings,
  # which each image's grid reads resized.
  config.sequence_length = config_dict.placeholder(int)  # See above.
  # Training at several lengths (NaFlex's): each step at one of these,
  # drawn per step, with token_budget // length images (the batch_size's
  # place); evaluation stays at sequence_length. Needs records by index.
  config.sequence_lengths = ()  # Patches per image; (): sequence_length.
  config.token_budget = config_dict.placeholder(int)  # Patches per step.
  config.pp_train = "inception_crop|flip_lr|value_range"  # '|'-joined op names.
  config.pp_eval = "resize_small|central_crop|value_range"  # Evaluation ops.
  # A leading inception_crop decodes only its window of a JPEG (the same
  # pixels, less work); False decodes the whole image first.
  config.pp_crop_on_decode = True  # See above.
  # inception_crop's resize: False is bilinear as the paper's code and
  # big_vision have it (and twice as fast); True also filters aliasing
  # where the crop shrinks (upscaling is the same either way).
  config.pp_crop_antialias = False  # See above.
  # Training images cross to the device as uint8 (rounded) where pp_train
  # ends in value_range, which the train step then applies: a quarter of
  # the bytes. False: float32 from the host.
  config.pp_uint8 = True  # See above.
  # NaViT's packing, in training (pp_train ends with patchify): each step's
  # batch_size images, each at its own shape (at most sequence_length
  # patches), packed into `sequences` sequences of `length` tokens, at most
  # `max_images` per sequence; attention and pooling stay within each
  # image. What does not fit is left out of the step and counted.
  config.packing = ml_collections.ConfigDict()  # See above.
  config.packing.length = config_dict.placeholder(int)  # Tokens; None: off.
  # Packed sequences per batch; None: room for every image at its largest,
  # batch_size * sequence_length / length (fewer: faster, may leave out).
  config.packing.sequences = config_dict.placeholder(int)  # See above.
  config.packing.max_images = 8  # Images per packed sequence at most.
  config.packing.token_drop = 0.0  # Share of each image's patches dropped.
  # Records read by index are shuffled over the whole split; this is the
  # shuffle window of TFDS datasets in TFRecord files, read in sequence.
  config.shuffle_buffer = 50_000  # Examples in that window.
  config.cache = False  # Keep the decoded dataset in host memory.
  # Unreadable images (empty, not an image, truncated) are left out and
  # listed in WORKDIR/unreadable_files.txt; past this share of the files a
  # pass reads, the run stops: the data is broken as a whole. Above 0, at
  # least 2 files are always allowed (fewer than half of them), so the odd
  # broken file of a small folder is only left out.
  config.max_unreadable_share = 0.01  # See above; 0: none tolerated.

  # Batches and duration.
  config.batch_size = 512  # Global training batch, split over all devices.
  config.eval_batch_size = 512  # Global evaluation batch.
  config.accum_steps = 1  # Micro-batches per update (gradient accumulation).
  config.total_steps = 10_000  # Training steps (unless num_epochs is set).
  config.num_epochs = config_dict.placeholder(float)  # Duration in epochs.

  # Optimizer and schedule.
  config.optimizer = "adam"  # adam (decoupled weight decay) | sgd (momentum).
  config.lr = 1e-3  # Peak learning rate, reached at the end of warmup.
  config.warmup_steps = 10_000  # Linear warmup from 0 to lr.
  config.warmup_epochs = config_dict.placeholder(float)  # Or warmup_steps.
  config.decay_type = "cosine"  # After warmup: cosine | linear | constant.
  config.b1 = 0.9  # Adam first-moment decay.
  config.b2 = 0.999  # Adam second-moment decay.
  config.momentum = 0.9  # SGD momentum.
  config.weight_decay = 0.0  # Decoupled weight decay (multiplied by the lr).
  config.grad_clip_norm = 1.0  # Global-norm gradient clipping; 0 disables.
  config.loss = "softmax_xent"  # softmax_xent | sigmoid_xent.
  config.label_smoothing = 0.0  # Training targets mixed with uniform (0: off).
  # Mixup (Zhang et al. 2018) in the train step, on the device: each example
  # is mixed, with probability p, with its neighbour in the batch (images and
  # labels with the same weight); the weight of the example's own image is
  # max(r, 1 - r), r ~ Beta(alpha, alpha), one draw per batch as big_vision
  # (per micro-batch, and neighbours within it, with accum_steps > 1).
  config.mixup = ml_collections.ConfigDict()  # See above.
  config.mixup.alpha = 0.0  # Beta concentration; 0: no mixup.
  config.mixup.p = 1.0  # Share of the examples mixed (big_vision: all).
  # FlexiViT (Beyer et al. 2023): each training step runs the model at a
  # patch size drawn uniformly from `patch_sizes` (each dividing
  # config.image_size; the parameters keep the variant's shapes, see
  # config.model.patch_size); the evaluators run at each of
  # `eval_patch_sizes` (() : all of patch_sizes), their metrics named
  # NAME_pSIZE/metric. () : off.
  config.flexi = ml_collections.ConfigDict()  # See above.
  config.flexi.patch_sizes = ()  # See above.
  config.flexi.eval_patch_sizes = ()  # See above.
  config.mu_dtype = "float32"  # Adam first moment / SGD momentum: or bfloat16.
  # Per-parameter rules: regexes match the whole '/'-joined parameter path
  # (e.g. 'head/.*'); the first match wins; a regex matching nothing is an
  # error.
  config.lr_mults = ()  # ((regex, factor), ...): learning-rate multipliers.
  config.wd_mults = ()  # ((regex, factor), ...): weight-decay multipliers.
  config.frozen = ()  # (regex, ...): not trained, and no optimizer state.
  # Layer-wise learning-rate decay d (BEiT's, as MAE, EVA and DINOv2
  # fine-tune; timm's --layer-decay), for any model: block i of L learns at
  # lr * d^(L - i), the embeddings at lr * d^(L + 1), the head and final
  # norms at lr; with lr_mults, both apply.
  config.layer_decay = config_dict.placeholder(float)  # In (0, 1]; None: off.
  config.ema_decay = 0.0  # EMA of params, what evaluation uses (paper: 0.9999).

  # Devices and sharding (see vit_jax/sharding.py).
  config.mesh = ml_collections.ConfigDict()  # Sizes of the named mesh axes.
  config.mesh.data = -1  # Devices on the batch/FSDP axis; -1: all the rest.
  config.mesh.model = 1  # Devices on the tensor-parallel axis.
  # Several TPU slices: the batch splits across them too; `data` and `model`
  # size each slice's share.
  config.mesh.slices = -1  # Slices; -1: the devices' own (slice_index).
  config.mesh.fsdp_over_slices = False  # FSDP across slices too (over DCN).
  config.sharding = ml_collections.ConfigDict()  # Parameter layout on the mesh.
  # ((regex, strategy), ...) on parameter paths, first match wins; strategies:
  # replicate | fsdp | tp | fsdp+tp. Every parameter must match a rule.
  config.sharding.params = ((".*", "replicate"),)  # See above.
  config.sharding.fsdp_min_size = 2**14  # Smaller parameters stay replicated.
  # Logical axis names (models/partitioning.py) -> mesh axes, for weights
  # under 'tp' and for the activations the model annotates.
  config.sharding.logical_axis_rules = (  # See above.
      ("batch", "data"), ("heads", "model"), ("mlp", "model"))

  # Model.
  config.model = get_model_config()

  # What training learns: supervised (from labels, with config.loss) or
  # masked_patch, the paper's self-supervision (App. B.1.2; labels are not
  # read, so unlabelled data works): corrupt some patch embeddings and
  # predict each corrupted patch's colours (vit_jax/models/masked_patch.py);
  # distill (below); siglip or clip, from image-text pairs (config.text);
  # mae (config.mae).
  config.objective = "supervised"  # See above.
  config.masked_patch = ml_collections.ConfigDict()  # Used by masked_patch.
  config.masked_patch.target = "mean_color"  # mean_color|downsized|pixels_l2.
  config.masked_patch.corrupt_rate = 0.5  # Share of the patches corrupted.
  config.masked_patch.mask_rate = 0.8  # Of those: replaced by the [mask] token,
  config.masked_patch.replace_rate = 0.1  # by another patch; the rest kept.
  config.masked_patch.color_bits = 3  # Bits per channel of colour targets.
  config.masked_patch.downsized_size = 4  # downsized: cells per patch side.

  # mae (He et al. 2021, "Masked Autoencoders Are Scalable Vision
  # Learners"): mask_ratio of each image's patches are dropped at random,
  # the ViT encodes the rest, and a light decoder predicts every patch's
  # pixels from them and a [mask] token at each dropped place; the loss is
  # the mean squared error on the dropped patches (vit_jax/models/mae.py).
  # Labels are not read; the checkpoint fine-tunes as any ViT.
  config.mae = ml_collections.ConfigDict()  # Used by mae.
  config.mae.mask_ratio = 0.75  # Share of each image's patches dropped.
  # The target: each patch's pixels standardised by their own mean and
  # variance (MAE's norm_pix_loss, the paper's better features); False:
  # the pixels as they are (in [-1, 1]).
  config.mae.norm_pix_loss = True  # See above.
  config.mae.decoder_width = 512  # The decoder's sizes: MAE's for B, L, H.
  config.mae.decoder_depth = 8  # Its blocks.
  config.mae.decoder_heads = 16  # Its attention heads.
  config.mae.decoder_mlp_dim = 2048  # Its MLPs' hidden width.

  # distill (Beyer et al. 2022, "Knowledge distillation: A good teacher is
  # patient and consistent"): the student matches frozen teachers'
  # predictions on exactly the images it sees (the same crop, flip and
  # mixup; config.mixup.alpha=1 is the paper's uniform coefficient), each
  # teacher seeing them resized to its own resolution. No label is learnt
  # unless label_weight says so (vit_jax/training/distill.py).
  config.distill = ml_collections.ConfigDict()  # Used by distill.
  # The teachers: each a checkpoint `vit-jax predict` loads (a workdir, a
  # file, a released name, a timm or transformers directory) with a head of
  # the data's classes, or a (checkpoint, image size) pair to run it at
  # another resolution than its own. Several: their predictions averaged.
  config.distill.teachers = ()  # See above.
  # Both models' logits are divided by it; the KL divergence is multiplied
  # by its square (so its gradients keep their scale).
  config.distill.temperature = 1.0  # See above.
  # probabilities: the KL divergence from the teachers' mean probabilities
  # to the student's (the paper's); logits: the mean squared difference
  # from the teachers' mean logits (no temperature).
  config.distill.target = "probabilities"  # See above.
  # The labels' loss (config.loss) added with this weight; 0: none, as the
  # paper (then the training data's labels are not read).
  config.distill.label_weight = 0.0  # See above.

  # Image-text pre-training (siglip | clip objectives: vit_jax/training/
  # contrastive.py): config.model is the image tower, this the text tower
  # (vit_jax/models/text.py) and the data's captions. The two-tower model's
  # names are big_vision's (img/, txt/, t, b).
  config.text = ml_collections.ConfigDict()  # Used by siglip and clip.
  # The text tower's widths, depth and heads: a ViT variant's (its patch
  # size unused), e.g. "ViT-B/16" for SigLIP B's text tower.
  config.text.variant = "ViT-B/16"  # See above.
  # Which output token is the text's embedding: last (SigLIP's, the padding
  # is EOS, so the last token sees every token), first, gap or map.
  config.text.pool = "last"  # See above.
  # A SentencePiece model file, a Hugging Face tokenizer.json, or 'digits'
  # (the built-in captions' own, trained from them: vit_jax/data/tokenizer.py).
  config.text.tokenizer = "digits"  # See above.
  config.text.vocab_size = config_dict.placeholder(int)  # None: tokenizer's.
  # Texts lower-cased before they are tokenised (SigLIP 2's towers were
  # trained so; loading one of its files sets it).
  config.text.lowercase = False  # See above.
  config.text.length = 16  # Tokens per text: truncated or padded to it.
  config.text.key = "captions"  # The dataset's text feature (one or a list).
  # The embedding both towers project to, compared by cosine similarity.
  config.text.embedding_dim = 128  # See above.
  # False (LiT's): the image tower has no projection, its pooled features
  # are its embedding (embedding_dim must then be the image tower's width).
  config.text.image_head = True  # See above.
  # The learned temperature t (logits x t) starts here; None: the
  # objective's (SigLIP: 10, CLIP: 1 / 0.07). bias_init: SigLIP's learned
  # bias b (logits + b); None: -10 (SigLIP's); CLIP has none.
  config.text.temperature_init = config_dict.placeholder(float)  # See above.
  config.text.bias_init = config_dict.placeholder(float)  # See above.
  # siglip's loss over the devices' ring (each device scores its images
  # against every device's texts in turn, never the B x B matrix); False:
  # the B x B logits as one expression, split by XLA (each device's images
  # against every text, all gathered: big_vision's jit trainer's form).
  config.text.chunked = True  # See above.

  # Starting weights (fine-tuning); ignored when the workdir has a checkpoint
  # to resume from.
  config.init = ml_collections.ConfigDict()  # See above.
  # An Orbax workdir (or one step of it), a released or big_vision .npz, or
  # timm / Hugging Face weights (.safetensors, .bin, .pth); a local path, a
  # URL (gs://...) or a released name (ViT-B/16@i21k, `vit-jax inspect
  # --list_released`). None: random init.
  config.init.checkpoint = config_dict.placeholder(str)  # See above.
  config.init.dont_load = ()  # Regexes: parameters to re-initialise instead.
  config.init.posemb_resize = "bilinear"  # Grid interpolation: or bicubic.
  # The file's position-embedding grid (H, W), when it is not square.
  config.init.source_grid = config_dict.placeholder(tuple)  # See above.
  # Where downloaded checkpoints (URLs, released names) are kept and reused;
  # None: $VIT_JAX_CACHE_DIR, else ~/.cache/vit_jax.
  config.init.cache_dir = config_dict.placeholder(str)  # See above.

  # Evaluators: config.evals.NAME = eval_entry(TYPE, ...) (below; the types
  # in vit_jax/evaluators/), any number; each runs where its type evaluates
  # config.objective (the objective lists its types), and logs its metrics
  # as NAME/metric.
  config.evals = ml_collections.ConfigDict()  # See above.
  # These run where they apply (enabled=None), with every field of their
  # type (vit_jax/evaluators/) so the command line can set each.
  config.evals.test = eval_entry(  # Supervised runs: the head's accuracy.
      "classification", enabled=None, skip_unlabelled=False,
      average_label_sets=False)
  config.evals.masked_patch = eval_entry(  # Self-supervised runs.
      "masked_patch", enabled=None)
  config.evals.mae = eval_entry(  # MAE runs: the reconstruction loss.
      "mae", enabled=None)
  # Runs of an objective with no evaluator type of its own (a user's): its
  # own loss on the evaluation data (vit_jax/evaluators/objective_loss.py).
  config.evals.loss = eval_entry("loss", enabled=None)  # See above.
  config.evals.distill = eval_entry(  # Distillation runs: the teachers'
      "distill", enabled=None, cache_teacher=True)  # accuracy, agreement, KL.
  # Image-text runs (siglip, clip): zero-shot accuracy on the evaluation
  # data (class names: the dataset's; templates: CLIP's short set) and
  # recall at 1, 5, 10 over its images and captions.
  config.evals.zeroshot = eval_entry(  # Image-text runs: zero-shot.
      "zeroshot", enabled=None, class_names=(), templates=())
  config.evals.retrieval = eval_entry(  # And image<->text recall.
      "retrieval", enabled=None)
  # config.fewshot's protocol on datasets (names or (name, train split, eval
  # split) triples); none: off.
  config.evals.fewshot = eval_entry(  # See above.
      "fewshot", enabled=None, datasets=())

  # Few-shot linear evaluation's protocol (vit_jax/fewshot/evaluator.py),
  # for `vit-jax fewshot` and the fewshot evaluators.
  config.fewshot = ml_collections.ConfigDict()  # See above.
  # What `vit-jax fewshot` sweeps: each a TFDS name, folder:/path or digits,
  # or a (name, train split, eval split) triple (fewshot/bundles.py has
  # big_vision's standard set).
  config.fewshot.datasets = ()  # See above.
  config.fewshot.train_split = "train"  # Where the k shots per class come from.
  config.fewshot.eval_split = "test"  # Where accuracy is measured.
  config.fewshot.pp_eval = config_dict.placeholder(str)  # None: config.pp_eval.
  config.fewshot.shots = (1, 5, 10, 25)  # Examples per class.
  config.fewshot.seeds = 3  # Random samples per shot count (mean and std).
  # fixed: big_vision's published protocol (L2 = l2_reg), comparable with
  # published tables; loo: the L2 of l2_grid with the best true
  # leave-one-out accuracy on the sample (fixed where a class has 1 shot).
  config.fewshot.l2_selection = "fixed"  # See above.
  config.fewshot.l2_reg = 2.0**10  # The fixed ridge L2 (big_vision's).
  config.fewshot.l2_grid = tuple(2.0**p for p in range(-6, 13, 2))  # For loo.
  config.fewshot.loo_max_heldout = 256  # loo: examples held out per sample.
  # Representation: pre_logits | head_input | logits | class_token |
  # patch_mean | class_and_patch_mean (DINOv2's probe) | block_i
  # (fewshot/features.py).
  config.fewshot.layer = "pre_logits"  # See above.
  config.fewshot.on_too_few = "fail"  # A class with < k examples: fail | skip.
  config.fewshot.float64 = False  # Solve in float64 on the host (else fp32).

  # Loop.
  config.log_every_steps = 50  # Training metrics to the writers.
  config.eval_every_steps = 1000  # Evaluators' default interval; 0: end only.
  config.checkpoint_every_steps = 1000  # Async Orbax save; also at the end.
  config.keep_checkpoints = 3  # Most recent checkpoints kept.
  config.keep_checkpoint_every_steps = 0  # Also keep every N-th step; 0: none.
  config.profile_steps = 0  # Profiler trace of this many steps after step 10.
  return config


def data_fields(**values) -> ml_collections.ConfigDict:
  """An evaluator's data (vit_jax/data/specs.py): what it reads instead of
  the config's evaluation data; a field left None keeps the config's."""
  data = ml_collections.ConfigDict()
  data.dataset = config_dict.placeholder(str)  # None: config.dataset.
  data.split = config_dict.placeholder(str)  # None: config.eval_split.
  data.pp = config_dict.placeholder(str)  # None: config.pp_eval.
  data.batch_size = config_dict.placeholder(int)  # None: eval_batch_size.
  data.cache = config_dict.placeholder(bool)  # None: config.cache.
  data.data_dir = config_dict.placeholder(str)  # None: config.data_dir.
  data.manual_dir = config_dict.placeholder(str)  # None: config.manual_dir.
  data.label_key = config_dict.placeholder(str)  # TFDS label feature.
  data.sequence_length = config_dict.placeholder(int)  # config.sequence_length.
  data.update(values)
  return data


def eval_entry(type_name: str, every_steps=None, data=None, enabled=True,
               **fields) -> ml_collections.ConfigDict:
  """An entry of config.evals: an evaluator of a registered type, whether
  it runs, its interval, its data (`data_fields`) and the type's own fields
  given here (the command line sets those; the others keep the defaults
  its type registered)."""
  entry = ml_collections.ConfigDict()
  entry.type = type_name  # A type of vit_jax/evaluators/ (or config.imports).
  # True: it runs; False: off; None: where its type applies to the config.
  entry.enabled = ml_collections.FieldReference(enabled, bool)
  # None: every config.eval_every_steps steps; 0: at the end only.
  entry.every_steps = ml_collections.FieldReference(every_steps, int)
  entry.data = data_fields(**(data or {}))  # What it reads.
  entry.update(fields)  # The type's own fields.
  return entry


def paper_transfer(config: ml_collections.ConfigDict, variant: str, init=None):
  """The paper's fine-tuning setting (App. B.1.1), which its transfer
  configs share: SGD momentum 0.9, batch 512, 500 warmup steps then
  cosine, clip 1, no weight decay, 384 px, bf16, and a new zero-initialised
  linear head on the weights of `init`."""
  # Overrides, not declarations: see get_config.
  config.update(
      dict(image_size=384, batch_size=512, eval_batch_size=512, optimizer="sgd",
           momentum=0.9, weight_decay=0.0, warmup_steps=500,
           decay_type="cosine", grad_clip_norm=1.0))
  config.model.variant = variant  # The model to fine-tune.
  config.model.representation_size = None  # A linear head.
  config.model.dtype = "bfloat16"  # bf16 compute, fp32 parameters.
  config.init.checkpoint = init  # The weights to start from.
  config.init.dont_load = ("head/.*",)  # The paper: a new zero head.


def runlocal(config: ml_collections.ConfigDict, image_size: int = 16):
  """Shrinks any recipe to a few CPU steps of `testing` on the built-in
  digits (what CI runs for each config's `runlocal` argument)."""
  # Overrides, not declarations: see get_config.
  config.update(
      dict(dataset="digits", train_split="train", eval_split="test",
           image_size=image_size, pp_train="inception_crop(0.5)|value_range",
           pp_eval="resize|value_range", shuffle_buffer=1_000, cache=True,
           batch_size=32, eval_batch_size=32, num_epochs=None, total_steps=10,
           warmup_steps=2, log_every_steps=5, eval_every_steps=0))
  config.model.variant = "testing"  # The tiny test model.
  config.model.dtype = "float32"  # bf16 is slow on CPUs.


def parse_arg(arg, **defaults) -> ml_collections.ConfigDict:
  """'name,variant=ViT-S/16,runlocal' -> {first: 'name', variant: ...,
  runlocal: True}; keys not in `defaults` are an error."""
  parsed = dict(defaults, runlocal=False)
  for i, token in enumerate(t for t in (arg or "").split(",") if t):
    key, eq, value = token.partition("=")
    if not eq and key == "runlocal":
      parsed["runlocal"] = True
    elif not eq and i == 0 and "first" in defaults:
      parsed["first"] = key
    elif eq and key in defaults:
      parsed[key] = value
    else:
      raise UserError(f"Config argument {token!r} is not one of "
                      f"{sorted(k for k in parsed if k != 'first')} "
                      "(KEY=VALUE) or runlocal.")
  return ml_collections.ConfigDict(parsed)
