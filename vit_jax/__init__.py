"""vit_jax: Vision Transformers in JAX/Flax, from one CPU to a pod.

The package in layers, lowest first. A module imports from its own layer
and the layers listed before it, never from one after it
(tests/test_layout.py keeps it so; docs/layout.md has every module):

  errors, console, paths, hardware
                        the base: our exceptions, our console lines, local
                        and gs:// paths, what each accelerator chip is
  vit_jax/config/       defaults (every field, once; the model's form),
                        checks of fields alone, imports (a user's
                        modules), recorded configs upgraded
  vit_jax/models/       ViT, the hybrid stem, the text tower and the two
                        towers, MAE's decoder, variants, scanned layers,
                        logical axes; a model from its config and its form
  vit_jax/sharding/     the mesh, batches on it, jit on it; partitioning
                        rules, parameters made on their shards
  vit_jax/data/         data specs, TFDS, image-folder and VTAB sources,
                        registered preprocessing ops, the tf.data pipeline,
                        unreadable images left out
  vit_jax/weights/      every weights format, in rooms by origin (files,
                        big_vision, timm, transformers, mae) around a core:
                        read, convert, resize, load, write; a config's open
                        choices decided
  vit_jax/training/     losses (SigLIP's on the devices' ring), the train
                        state, the jitted step, FSDP's plan and gathering,
                        optimizer, mixup, checkpoints, a distillation's
                        teachers
  vit_jax/objectives/   what training learns, registered by name: each
                        objective's checks, model, batch, loss, teachers,
                        evaluators and words; the step assembled for it
  vit_jax/fewshot/      the closed-form linear solver, features, sweeps
  vit_jax/evaluators/   config.evals' entries and their registered types:
                        classification, masked patch prediction, MAE's
                        reconstruction, few-shot, distillation, zero-shot
                        and retrieval
  vit_jax/loop/         train_and_evaluate: the config's checks gathered,
                        the fit before the first step, the loop
  vit_jax/inference/    a checkpoint ready to apply: a classifier; an
                        image-text one (both towers) ready to embed and
                        classify zero-shot
  vit_jax/analysis/     the paper's analyses and their figures
  vit_jax/performance/  plan for a topology (memory, communication, a
                        roofline of the step), speed, profiling
  vit_jax/vtab/         the runner over the VTAB-1k tasks
  liveness, cli         a dead process ends the others; the commands'
                        dispatcher and errors
  vit_jax/commands/     one module per `vit-jax NAME`: flags and main only
"""
