"""`vit-jax plan --search`: the candidates of a topology (no compiling),
and one search by the command of the `testing` model for a v5e-4: ranked,
one dropped, bounded, its winner's overrides parsing back into its config."""

import json
import os
import shlex
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest

from vit_jax.performance import search

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small batches and a wide head (16 x 65536 weights): the parameters and
# their Adam moments outweigh the activations, so replicating them takes
# about twice the memory FSDP over 4 devices does.
BASE = [
    "--config=configs/digits.py:runlocal", "--config.batch_size=8",
    "--config.eval_batch_size=8", "--config.sharding.fsdp_min_size=0"
]
NUM_CLASSES = 65536


def _config(args):
  """The config the command would make of `args` (ml_collections' own
  parsing of --config and its --config.* overrides)."""
  argv, values = ["plan"] + args, flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  return values.config


def test_candidates_of_a_topology_most_promising_first():
  config = _config(BASE)  # `testing`: 2 heads, MLP 32; batch 8.
  found, skipped = search.candidates(config, 8)
  layouts = sorted({(c.strategy, c.model) for c in found})
  # 2 heads split over 2 devices only.
  assert layouts == [("fsdp", 1), ("fsdp+tp", 2), ("replicate", 1), ("tp", 2)]
  assert skipped == [
      ("tp, fsdp+tp (model 4)", "2 heads do not split over 4 devices"),
      ("tp, fsdp+tp (model 8)", "2 heads do not split over 8 devices"),
  ]
  assert found[:2] == [
      search.Candidate("fsdp", 1, True, "none", 1),
      search.Candidate("replicate", 1, True, "none", 1)
  ]
  # Micro-batches while the per-device batch divides: 1 on 8 data shards,
  # 1 and 2 on 4 (model 2).
  accums = lambda s, m: sorted(
      {c.accum_steps for c in found if (c.strategy, c.model) == (s, m)})
  assert accums("fsdp", 1) == [1] and accums("tp", 2) == [1, 2]
  # 2 x (scan, remat) per micro-batch count and layout.
  assert len(found) == 4 * (1 + 1 + 2 + 2)
  # --nounrolled: the scanned half, and no compile kept back for unrolling.
  scanned, _ = search.candidates(config, 8, unrolled=False)
  assert scanned == [c for c in found if c.scan_layers]
  assert search._bound(scanned[0], 3, unrolled=False) == 3
  assert search._bound(scanned[0], 3, unrolled=True) == 2
  # On two slices, FSDP within the slices or across them; a layout whose
  # data shards the batch does not split over is skipped.
  with config.unlocked():
    config.batch_size = 4
  found, skipped = search.candidates(config, 4, slices=2)
  assert {(c.strategy, c.fsdp_over_slices) for c in found
         } == {("fsdp+tp", False), ("fsdp+tp", True), ("tp", False)}
  assert skipped[1:] == [
      ("fsdp (model 1)", "batch 4 does not split over 8 data shards"),
      ("replicate (model 1)", "batch 4 does not split over 8 data shards"),
  ]


def test_only_the_fastest_scanned_candidate_is_tried_unrolled():
  fits = lambda c, ms: search._result(c, "fits", "", {
      "fits": True,
      "time": {
          "est_step_s": ms / 1e3
      },
      "total_bytes": 1
  })
  fast, slow = (search.Candidate("fsdp", 1, True, "none", 1),
                search.Candidate("replicate", 1, True, "none", 1))
  unrolled = lambda c: search.Candidate(c.strategy, c.model, False, c.remat, c.
                                        accum_steps)
  results = [fits(slow, 30), fits(fast, 20)]
  assert search.unrolling(fast, results, []) == ""  # Scanned: compile it.
  assert search.unrolling(unrolled(fast), results, []) == ""
  assert search.unrolling(unrolled(slow), results, []) == (
      "only the fastest scanned candidate (fsdp (model 1), scan True, remat "
      "none, accum 1) is unrolled")
  # A scanned candidate still to decide may turn out faster: wait.
  assert search.unrolling(unrolled(fast), results, [slow]) is None
  assert search.unrolling(unrolled(fast), [], []) == "no scanned layout fits"


# FSDP needs about 9 MiB scanned and 12 unrolled, replication 19: a 20
# MiB device fits the first two in its 90%.
HBM_GIB = 20 / 1024


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> tuple[str, dict]:
  """(stdout, JSON) of the command's search for a v5e-4 (16 GiB per device,
  here 20 MiB), bounded to 3 compiles: FSDP and replicated (the next
  layout) scanned, then the fastest of those that fit unrolled (the last
  compile is kept for it)."""
  out = tmp_path_factory.mktemp("search") / "search.json"
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "plan", "--search", *BASE,
      "--topology=v5e:2x2", f"--num_classes={NUM_CLASSES}",
      f"--hbm_gib={HBM_GIB}", "--max_candidates=3", f"--out={out}"
  ], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout, json.loads(out.read_text())


def test_a_search_ranks_what_fits_and_drops_what_does_not(searched):
  text, s = searched
  assert s["compiled"] == 3 and text.startswith(
      "3 candidates compiled for v5e:2x2 in ")
  ranked = [search.Candidate(**r["candidate"]) for r in s["ranked"]]
  assert {(c.strategy, c.scan_layers) for c in ranked} == {("fsdp", True),
                                                           ("fsdp", False)}
  steps = [r["speed"]["step_s"] for r in s["ranked"]]
  assert steps == sorted(steps) and all(
      r["report"]["fits"] for r in s["ranked"])
  assert all(0 < r["speed"]["mfu"] < 1 for r in s["ranked"])
  [dropped] = s["dropped"]
  assert dropped["candidate"]["strategy"] == "replicate"
  assert dropped["reason"].startswith("does not fit: ")
  assert dropped["reason"].endswith(" per device, over 90% of 20.0 MiB")
  assert (f"  {search.Candidate(**dropped['candidate']).describe()}: does not "
          "fit") in text
  # The rest: settled by these results, or over the bound.
  over = [r for r in s["not_compiled"] if r["status"] == "not compiled"]
  assert over and all(r["reason"] == "over --max_candidates=3" for r in over)
  assert any(r["status"] == "settled" for r in s["not_compiled"])
  assert len(s["ranked"]) + len(s["dropped"]) + len(s["not_compiled"]) == len(
      search.candidates(_config(BASE), 4)[0])
  assert f"| 1 | fsdp | d4 m1 | {ranked[0].scan_layers} | none | 1 | yes |" in (
      text)
  # Unrolled layers were tried; --nounrolled would say they were not.
  assert s["unrolled"] and "unrolled layers" not in text
  nothing = {**s, "ranked": [], "dropped": [], "not_compiled": []}
  assert "\nNot tried:\n  unrolled layers: --nounrolled\n" in (
      search.format_search({
          **nothing, "skipped": [],
          "unrolled": False
      }))


def test_the_winners_overrides_give_its_config_back(searched):
  text, s = searched
  winner = search.Candidate(**s["ranked"][0]["candidate"])
  printed = text.splitlines()[-1]
  assert text.splitlines()[-2] == (f"Winner: {winner.describe()}. For "
                                   "vit-jax train:")
  assert printed.strip() == winner.flags()
  assert "--config.sharding.params=\"(('.*', 'fsdp'),)\"" in printed
  given_back = _config(BASE + shlex.split(printed))
  assert given_back.to_dict() == winner.apply(_config(BASE)).to_dict()


def test_a_bad_bound_is_a_one_line_error():
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "plan", "--search", *BASE,
      "--topology=cpu:2", "--max_candidates=0"
  ], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
      "error: flag --max_candidates=0: give how many candidates to compile at "
      "most, 1 or more."
  ]
