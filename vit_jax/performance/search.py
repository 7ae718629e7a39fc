"""Search for the fastest layout that fits: `vit-jax plan --search`.

Each candidate is the config with one sharding strategy for every
parameter (replicate, fsdp, tp or fsdp+tp, the last two with each
`config.mesh.model` that divides a slice's devices and the widths tensor
parallelism splits), scanned or unrolled layers, rematerialisation off or
full, `accum_steps` 1, 2, 4, ... while the per-device batch divides and,
on several slices, FSDP inside the slices or across them. `candidates`
lists them, most promising first (a weighted count of the choices that
usually cost time: a layout further down, remat, micro-batches), every
scanned candidate before any unrolled one. `search` compiles them in that
order through `planning.plan`, at most `max_candidates`, and skips,
uncompiled, a candidate that another's result settles: one with more
recompute or more micro-batches than a fitting one of the same layout is
no faster (the roofline counts the same work or more), and one that keeps
more in memory than one that did not fit does not fit either. Unrolled
layers compile several times slower (ViT-L/16 for a v5e:4x4: 6 to 9
minutes against 1 to 2.5 here), so only the fastest scanned candidate is
tried unrolled too (`unrolling`; the last of the `max_candidates`
compilations is kept for it). Those that fit are ranked
by the roofline's step time (by memory where no time is known);
`format_search` prints the table and the winner's `--config.*` overrides
for `vit-jax train`.
"""

from concurrent import futures
import dataclasses
import math
import time
from typing import Optional

import jax
import ml_collections

from vit_jax import console
from vit_jax import hardware
from vit_jax import models
from vit_jax import sharding
from vit_jax.errors import UserError
from vit_jax.performance import planning
from vit_jax.performance import targets

# Candidates compiled at once (XLA compiles without the GIL). On a 2-core
# host two were no faster than one: each compilation took twice as long.
THREADS = 1
MAX_CANDIDATES = 8
# Weights of the choices that usually cost time, for the order of trying:
# a strategy further down `_layouts`' order, rematerialising, each doubling
# of the micro-batches, FSDP over DCN; unrolled layers after all scanned.
_COST = {"layout": 1, "scan": 1000, "remat": 2, "accum": 2, "over_slices": 1}


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One layout: `apply` makes its config, `flags` the overrides."""
  strategy: str  # For every parameter: sharding.STRATEGIES.
  model: int  # config.mesh.model; config.mesh.data takes the rest.
  scan_layers: bool
  remat: str  # none | full
  accum_steps: int
  fsdp_over_slices: Optional[bool] = None  # None: one slice, left as set.

  def fields(self) -> dict:
    """The config fields it sets ('a.b' -> value)."""
    fields = {
        "sharding.params": ((".*", self.strategy),),
        "mesh.data": -1,
        "mesh.model": self.model,
        "model.scan_layers": self.scan_layers,
        "model.remat": self.remat,
        "accum_steps": self.accum_steps,
    }
    if self.fsdp_over_slices is not None:
      fields["mesh.fsdp_over_slices"] = self.fsdp_over_slices
    return fields

  def apply(self, config: ml_collections.ConfigDict):
    config = config.copy_and_resolve_references()
    for name, value in self.fields().items():
      *parents, leaf = name.split(".")
      node = config
      for parent in parents:
        node = node[parent]
      node[leaf] = value
    return config

  def flags(self) -> str:
    """The overrides as `vit-jax train` takes them (shell-quoted)."""
    return " ".join(f"--config.{name}={_flag_value(value)}"
                    for name, value in self.fields().items())

  def describe(self) -> str:
    over = {None: "", False: ", FSDP in slices", True: ", FSDP over slices"}
    return (f"{self.strategy} (model {self.model}), scan {self.scan_layers}, "
            f"remat {self.remat}, accum {self.accum_steps}"
            f"{over[self.fsdp_over_slices]}")


def _flag_value(value) -> str:
  if isinstance(value, tuple):  # A Python literal, in double quotes.
    return f'"{value!r}"'
  return str(value)


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _split_widths(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The widths tensor parallelism splits over `model` ('heads': 16, ...),
  as the config's logical-axis rules map them."""
  variant = models.get_variant(config.model.variant)
  widths = {"heads": variant.num_heads}
  if hasattr(variant, "mlp_dim"):
    widths["mlp"] = variant.mlp_dim
  else:  # A Mixer's two MLPs both split along `mlp`.
    widths["mlp"] = math.gcd(variant.tokens_mlp_dim, variant.channels_mlp_dim)
  split = {
      name for name, axis in config.sharding.logical_axis_rules
      if axis == sharding.MODEL_AXIS
  }
  return {k: v for k, v in widths.items() if k in split and v}


def _layouts(config, per_slice: int) -> tuple[list, list]:
  """([(strategy, model)], [(what, why skipped)]), most promising first:
  fsdp, replicate, then fsdp+tp and tp with a growing model axis."""
  layouts, skipped = [("fsdp", 1), ("replicate", 1)], []
  widths = _split_widths(config)
  for model in _divisors(per_slice)[1:]:
    if not widths:
      skipped.append((f"tp, fsdp+tp (model {model})",
                      "config.sharding.logical_axis_rules map nothing to "
                      "the model axis"))
      continue
    refused = [f"{n} {name}" for name, n in widths.items() if n % model]
    if refused:
      skipped.append((f"tp, fsdp+tp (model {model})",
                      f"{' and '.join(refused)} do not split over {model} "
                      "devices"))
      continue
    layouts += [("fsdp+tp", model), ("tp", model)]
  return layouts, skipped


def candidates(config: ml_collections.ConfigDict, per_slice: int,
               slices: int = 1,
               unrolled: bool = True) -> tuple[list[Candidate], list]:
  """(every candidate, most promising first; [(what, why skipped)]) for
  `slices` slices of `per_slice` devices, scanned layers only unless
  `unrolled`. Nothing is compiled."""
  layouts, skipped = _layouts(config, per_slice)
  # Scanned layers compile several times faster.
  scans = (True, False) if unrolled else (True,)
  found = []
  for rank, (strategy, model) in enumerate(layouts):
    shards = per_slice // model * slices
    if config.batch_size % shards:
      skipped.append((f"{strategy} (model {model})",
                      f"batch {config.batch_size} does not split over "
                      f"{shards} data shards"))
      continue
    per_device = config.batch_size // shards
    accums = [
        a for a in (2**i for i in range(per_device.bit_length()))
        if per_device % a == 0
    ]
    overs = ((False, True) if slices > 1 and "fsdp" in strategy else
             (False,) if slices > 1 else (None,))
    for scan_rank, scan in enumerate(scans):
      for remat_rank, remat in enumerate(("none", "full")):
        for accum_rank, accum in enumerate(accums):
          for over in overs:
            cost = (_COST["layout"] * rank + _COST["scan"] * scan_rank +
                    _COST["remat"] * remat_rank + _COST["accum"] * accum_rank +
                    _COST["over_slices"] * bool(over))
            found.append((cost, len(found),
                          Candidate(strategy, model, scan, remat, accum, over)))
  return [c for _, _, c in sorted(found, key=lambda x: x[:2])], skipped


def _group(c: Candidate) -> tuple:
  return c.strategy, c.model, c.scan_layers, c.fsdp_over_slices


def _frugality(c: Candidate) -> tuple[int, int]:
  return ("none", "full").index(c.remat), c.accum_steps


def settled(c: Candidate, results: list[dict]) -> str:
  """Why `c` need not be compiled, from the results of its layout ('' if it
  must): it only adds recompute or micro-batches to one that fits, or it
  keeps more in memory than one that does not."""
  mine = _frugality(c)
  for r in results:
    other, report = r["candidate"], r["report"]
    if _group(other) != _group(c) or report is None:
      continue
    theirs = _frugality(other)
    if (report["fits"] and mine != theirs and
        all(m >= t for m, t in zip(mine, theirs))):
      return (f"no faster than remat {other.remat}, accum "
              f"{other.accum_steps}, which fits")
    if (report["fits"] is False and all(m <= t for m, t in zip(mine, theirs))):
      return (f"needs more memory than remat {other.remat}, accum "
              f"{other.accum_steps}, which does not fit")
  return ""


def unrolling(c: Candidate, results: list[dict], waiting) -> Optional[str]:
  """For an unrolled candidate: '' to compile it, the reason it need not be
  compiled, or None to wait (a scanned candidate is still `waiting`, so
  the fastest scanned one is not known yet). Only the twin of the fastest
  scanned candidate that fits is compiled: unrolling speeds a layout up,
  it does not change what fits."""
  if c.scan_layers:
    return ""
  if any(other.scan_layers for other in waiting):
    return None
  scanned = [
      r for r in results if r["status"] == "fits" and r["candidate"].scan_layers
  ]
  if not scanned:
    return "no scanned layout fits"
  best = min(scanned, key=_speed)["candidate"]
  if dataclasses.replace(best, scan_layers=False) == c:
    return ""
  return f"only the fastest scanned candidate ({best.describe()}) is unrolled"


def _bound(c: Candidate, max_candidates: int, unrolled: bool) -> int:
  """Compilations allowed before `c`: with `unrolled`, the last is kept for
  the unrolled form of the fastest scanned candidate."""
  keep = unrolled and c.scan_layers and max_candidates > 1
  return max_candidates - keep


def _plan_one(config, candidate: Candidate, topology: str,
              options: dict) -> dict:
  """A candidate's result: status 'fits' (ranked) or 'dropped' (why), and
  the seconds its plan took."""
  start = time.monotonic()
  try:
    report = planning.plan(candidate.apply(config), topology, **options)
  except (UserError, jax.errors.JaxRuntimeError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    result = _result(candidate, "dropped", first[:300])
  else:
    result = _result(candidate, "fits", "", report)
    if report["fits"] is False:
      least = "at least " if report.get("compile_error") else ""
      result = _result(
          candidate, "dropped",
          f"does not fit: {least}{_size(report['total_bytes'])} per device, "
          f"over {report['fit_fraction']:.0%} of "
          f"{_size(report['hbm_bytes_per_device'])}", report)
  return {**result, "seconds": time.monotonic() - start}


def _result(candidate: Candidate, status: str, reason: str = "",
            report: Optional[dict] = None) -> dict:
  return {
      "candidate": candidate,
      "status": status,
      "reason": reason,
      "report": report
  }


def _slices(config, topology: str, options: dict) -> tuple[int, int]:
  """(devices per slice, slices) of the target, as the mesh will see them."""
  count = options.get("slices", 1)
  devices = targets.target_devices(topology, count)
  groups = sharding.slice_groups(devices, config.mesh.slices)
  return len(groups[0]), len(groups)


def _may_settle(c: Candidate, pending) -> bool:
  """Whether a candidate still compiling may settle `c` (then `c` waits)."""
  mine = _frugality(c)
  for other in pending:
    theirs = _frugality(other)
    if _group(other) == _group(c) and (
        all(m >= t for m, t in zip(mine, theirs)) or
        all(m <= t for m, t in zip(mine, theirs))):
      return True
  return False


def search(config: ml_collections.ConfigDict, topology: str, *,
           max_candidates: int = MAX_CANDIDATES, threads: int = THREADS,
           unrolled: bool = True, **options) -> dict:
  """Compiles the candidates for `topology` (`options`: planning.plan's,
  e.g. num_classes, hbm_gib, slices), with unrolled layers too if
  `unrolled`; returns the whole search, ranked."""
  start = time.monotonic()
  per_slice, slices = _slices(config, topology, options)
  queue, skipped = candidates(config, per_slice, slices, unrolled)
  order = {c: i for i, c in enumerate(queue)}
  results, pending, compiled = [], {}, 0
  by_group = {}  # Results of each layout, what `settled` reads.
  with futures.ThreadPoolExecutor(threads) as pool:
    while queue:
      # The first candidate that can be decided now, in the queue's order;
      # one that a compiling candidate may settle waits for it.
      for i, c in enumerate(queue):
        why = settled(c, by_group.get(_group(c), []))
        if not why:
          why = unrolling(c, results, [*queue[:i], *pending.values()])
          if why is None:  # The fastest scanned candidate is not known yet.
            continue
        if why:
          results.append(_result(c, "settled", why))
        elif compiled >= _bound(c, max_candidates, unrolled) and not pending:
          results.append(
              _result(c, "not compiled",
                      f"over --max_candidates={max_candidates}"))
        elif (compiled < _bound(c, max_candidates, unrolled) and
              len(pending) < threads and not _may_settle(c, pending.values())):
          compiled += 1
          pending[pool.submit(_plan_one, config, c, topology, options)] = c
        else:
          continue
        del queue[i]
        break
      else:  # Nothing can be decided until a compilation ends.
        done, _ = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
        for future in done:
          results.append(future.result())
          _say(results[-1], len(results), len(order))
          by_group.setdefault(_group(pending.pop(future)), []).append(
              results[-1])
    for future in futures.as_completed(pending):
      results.append(future.result())
      _say(results[-1], len(results), len(order))
  results.sort(key=lambda r: order[r["candidate"]])
  return {
      "topology": topology,
      "devices_per_slice": per_slice,
      "slices": slices,
      "compiled": compiled,
      "threads": threads,
      "seconds": time.monotonic() - start,
      "ranked": sorted((r for r in results if r["status"] == "fits"),
                       key=_speed),
      "dropped": [r for r in results if r["status"] == "dropped"],
      "not_compiled": [
          r for r in results if r["status"] in ("settled", "not compiled")
      ],
      "skipped": skipped,
      "unrolled": unrolled,
  }


def _say(r: dict, decided: int, total: int):
  """One line per compiled candidate: a search may take many minutes."""
  report = r["report"]
  step = (f", {report['time']['est_step_s'] * 1e3:.3g} ms"
          if r["status"] == "fits" and report["time"] else "")
  console.say("%d of %d decided; %s: %s%s (%.0f s)", decided, total,
              r["candidate"].describe(), r["reason"] or "fits", step,
              r["seconds"])


def _speed(r: dict) -> tuple:
  """Known fit first, then the estimated step (or memory, without one)."""
  report = r["report"]
  step = report["time"]["est_step_s"] if report["time"] else None
  return (report["fits"] is not True, step is None, step or
          0.0, report["total_bytes"])


def _gib(b: float) -> str:
  return f"{b / 2**30:.2f}"


def _size(b: float) -> str:
  return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def _mesh(report: dict) -> str:
  return " ".join(f"{axis[0]}{size}" for axis, size in report["mesh"].items())


def _moved(report: dict) -> str:
  """GiB sent per device per step: ICI/DCN where the plan splits them."""
  c = report["communication"]
  if c is None:
    return "?"
  if report.get("slices", 1) > 1 and "dcn_bytes" in c:  # DCN: MiB, not 0.00.
    return f"{_gib(c['ici_bytes'])} / {c['dcn_bytes'] / 2**20:.2f} MiB"
  return _gib(c["bytes"])


def speed(report: dict) -> dict:
  """Estimated step (s), images/s and MFU (model FLOPs at the chips' peak)
  of a plan's report; None where no time is estimated."""
  t = report["time"]
  if not t:
    return {"step_s": None, "images_per_s": None, "mfu": None}
  step = t["est_step_s"]
  peak = hardware.peak_flops(report["device_kind"], report["devices_per_chip"])
  mfu = (report["model_flops_per_step"] /
         (step * peak * report["num_devices"]) if peak else None)
  return {
      "step_s": step,
      "images_per_s": report["batch_size"] / step,
      "mfu": mfu
  }


def format_row(rank, r: dict) -> str:
  c, report = r["candidate"], r["report"]
  fits = {None: "?", True: "yes", False: "no"}[report["fits"]]
  s = speed(report)
  step, images, mfu = (("?",) * 3 if s["step_s"] is None else
                       (f"{s['step_s'] * 1e3:.3g}", f"{s['images_per_s']:.0f}",
                        "?" if s["mfu"] is None else f"{s['mfu']:.1%}"))
  strategy = c.strategy + {
      None: "",
      False: "",
      True: " (over slices)"
  }[c.fsdp_over_slices]
  return (f"| {rank} | {strategy} | {_mesh(report)} | {c.scan_layers} | "
          f"{c.remat} | {c.accum_steps} | {fits} | "
          f"{_gib(report['total_bytes'])} | {_moved(report)} | {step} | "
          f"{images} | {mfu} |")


def format_search(s: dict) -> str:
  """The ranked table, what was dropped and why, and the winner's flags."""
  where = s["topology"] + (f" x {s['slices']} slices"
                           if s["slices"] > 1 else "")
  moved = "GiB moved ICI / DCN" if s["slices"] > 1 else "GiB moved"
  lines = [
      f"{s['compiled']} candidates compiled for {where} in "
      f"{s['seconds']:.0f} s; those that fit, fastest first (roofline "
      "estimate; per device):", "",
      f"| # | strategy | mesh | scan | remat | accum | fits | GiB | {moved} "
      "| est. step (ms) | images/s | MFU |", "|---" * 12 + "|"
  ]
  lines += [format_row(i + 1, r) for i, r in enumerate(s["ranked"])]
  if s["dropped"]:
    lines += ["", "Dropped:"]
    lines += [
        f"  {r['candidate'].describe()}: {r['reason']}" for r in s["dropped"]
    ]
  skipped = s["skipped"] + ([] if s.get("unrolled", True) else
                            [("unrolled layers", "--nounrolled")])
  if skipped:
    lines += ["", "Not tried:"]
    lines += [f"  {what}: {why}" for what, why in skipped]
  settled = sum(r["status"] == "settled" for r in s["not_compiled"])
  over = len(s["not_compiled"]) - settled
  if s["not_compiled"]:
    lines += [
        "", f"Not compiled: {settled} settled by others' results, {over} "
        "over --max_candidates."
    ]
  if not s["ranked"]:
    return "\n".join(lines + ["", "No candidate fits."])
  best = s["ranked"][0]
  return "\n".join(lines + [
      "", f"Winner: {best['candidate'].describe()}. For vit-jax train:",
      f"  {best['candidate'].flags()}"
  ])


def to_json(s: dict) -> dict:
  """The search as JSON: each result's candidate as its fields and flags."""

  def result(r):
    c = r["candidate"]
    return {
        **r, "candidate": dataclasses.asdict(c),
        "flags": c.flags(),
        "speed": speed(r["report"]) if r["report"] else None
    }

  kinds = ("ranked", "dropped", "not_compiled")
  lists = {k: [result(r) for r in s[k]] for k in kinds}
  return {**s, **lists, "skipped": [list(x) for x in s["skipped"]]}
