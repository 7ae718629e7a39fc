r"""The plan command: memory, traffic and step time of a config, no devices.

    vit-jax plan --config=configs/pretrain.py:i1k,variant=ViT-L/16 \
        --config.batch_size=256 --topology=v5e:4x4 --out=plan.json

(or `python -m vit_jax plan ...`). See `vit_jax/performance/planning.py` for
what is compiled and how the report is made. `--search` compiles many
layouts of the config and ranks those that fit
(`vit_jax/performance/search.py`).
"""

import json

from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax import paths
from vit_jax.performance import planning
from vit_jax.performance import search
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
flags.DEFINE_integer(
    "slices", 1, "Slices of --topology, joined by the data-centre network "
    "(DCN); the report splits what moves between ICI and DCN.")
flags.DEFINE_float(
    "dcn_gbps", None, "DCN bandwidth per chip in GB/s, each way, if not in "
    "the table (or to override it).")
flags.DEFINE_bool("row", False, "Print one Markdown table row instead.")
flags.DEFINE_bool(
    "search", False, "Compile the config's sharding, mesh, scan, remat and "
    "micro-batch variants; rank those that fit by estimated step time.")
flags.DEFINE_integer("max_candidates", search.MAX_CANDIDATES,
                     "With --search, compile at most this many.")
flags.DEFINE_bool(
    "unrolled", True, "With --search, also try the fastest scanned layout "
    "with unrolled layers (it compiles several times slower: --nounrolled "
    "bounds the search of the deepest models).")
flags.mark_flags_as_required(["config", "topology"])
cli.check_flag("hbm_gib", lambda gib: gib > 0,
               "give each device's memory in GiB, a positive number.")
cli.check_flag("max_candidates", lambda count: count >= 1,
               "give how many candidates to compile at most, 1 or more.")
cli.check_flag("slices", lambda slices: slices >= 1,
               "give the number of slices, a whole number of at least 1.")
cli.check_flag("dcn_gbps", lambda gbps: gbps > 0,
               "give each chip's DCN bandwidth in GB/s, a positive number.")


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
  options = dict(slices=FLAGS.slices, dcn_gbps=FLAGS.dcn_gbps)
  if FLAGS.search:
    found = search.search(
        FLAGS.config, FLAGS.topology, max_candidates=FLAGS.max_candidates,
        unrolled=FLAGS.unrolled, num_classes=FLAGS.num_classes,
        hbm_gib=FLAGS.hbm_gib, **options)
    print(search.format_search(found))
    if FLAGS.out:
      paths.resolve(FLAGS.out).write_text(
          json.dumps(search.to_json(found), indent=2))
    return
  result = planning.plan(FLAGS.config, FLAGS.topology, FLAGS.num_classes,
                         FLAGS.hbm_gib, **options)
  print(
      planning.format_row(result) if FLAGS.row else planning.
      format_report(result))
  if FLAGS.out:
    paths.resolve(FLAGS.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
  cli.run(main)
