"""vit_jax: Vision Transformers in JAX/Flax, from one CPU to a pod.

The package, one line per folder (docs/layout.md has every module):

  vit_jax/              cli (the commands' preamble and dispatcher), console,
                        errors, paths (local and gs://), sharding (mesh and
                        rules), inference (a checkpoint ready to apply),
                        liveness (a dead process ends the others)
  vit_jax/commands/     one module per `vit-jax NAME`: flags and main only
  vit_jax/config/       defaults (every field, once), checks (mistakes
                        caught before compiling), imports (a user's modules)
  vit_jax/models/       ViT, the hybrid stem, variants, layouts, logical axes
  vit_jax/data/         data specs, TFDS and image-folder sources,
                        registered preprocessing ops, the tf.data pipeline,
                        unreadable images left out
  vit_jax/training/     the loop (trainer), the jitted step, optimizer, mixup,
                        checkpoints
  vit_jax/evaluators/   config.evals' entries and their registered types:
                        classification, masked patch prediction
  vit_jax/fewshot/      the closed-form linear solver, features, sweeps
  vit_jax/weights/      every weights format: read, convert, resize, load,
                        write
  vit_jax/performance/  plan for a topology (memory, communication, a
                        roofline of the step), speed, profiling, chips
  vit_jax/analysis/     the paper's analyses and their figures
  vit_jax/vtab/         the VTAB-1k tasks and the runner over them
"""
