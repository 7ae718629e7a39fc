r"""The plan command: memory, traffic and step time of a config, no devices.

    vit-jax plan --config=configs/pretrain.py:i1k,variant=ViT-L/16 \
        --config.batch_size=256 --topology=v5e:4x4 --out=plan.json

(or `python -m vit_jax plan ...`). See `vit_jax/performance/planning.py` for
what is compiled and how the report is made.
"""

import json

from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax import paths
from vit_jax.performance import planning
from vit_jax.performance import targets

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config (FILE.py:ARG).",
                                lock_config=True)
flags.DEFINE_string(
    "topology", None, "A TPU topology libtpu describes (v3:4x4, v5e:4x4, "
    "v5p:2x2x4, tpu7x:2x2x1, ...), or cpu:N.")
flags.DEFINE_string("out", None, "Also write the report here as JSON.")
flags.DEFINE_integer("num_classes", None, "Classes, if not from the data.",
                     lower_bound=1)
flags.DEFINE_float("hbm_gib", None, "Device memory, if not in the table.")
flags.DEFINE_bool("row", False, "Print one Markdown table row instead.")
flags.mark_flags_as_required(["config", "topology"])
cli.check_flag("hbm_gib", lambda gib: gib > 0,
               "give each device's memory in GiB, a positive number.")


def _set_up_devices():
  """Before JAX starts its backends: the plan runs on this host's CPU (a
  TPU target is only compiled for), with N devices for cpu:N."""
  jax.config.update("jax_platforms", "cpu")
  if FLAGS.topology.startswith("cpu:"):
    jax.config.update("jax_num_cpu_devices",
                      targets.cpu_device_count(FLAGS.topology))
  else:  # A program for a TPU that is not attached cannot be read back from
    # JAX's persistent compilation cache (there is no TPU to load it on).
    jax.config.update("jax_enable_compilation_cache", False)


def main(argv):
  del argv
  _set_up_devices()
  result = planning.plan(FLAGS.config, FLAGS.topology, FLAGS.num_classes,
                         FLAGS.hbm_gib)
  print(
      planning.format_row(result) if FLAGS.row else planning.
      format_report(result))
  if FLAGS.out:
    paths.resolve(FLAGS.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
  cli.run(main)
