"""Where a compiled step's time goes, from its scheduled program.

Each instruction costs the larger of its compute (its matmul and
convolution FLOPs at the chip's peak) and its memory traffic (the bytes it
reads and writes, at the chip's HBM bandwidth); a fusion counts the FLOPs
inside it and the bytes at its boundary. Collectives take their bytes sent
(`communication.py`) at the chip's interconnect bandwidth, one at a time;
on several slices, those between slices take theirs at the chip's share of
the data-centre network (DCN) instead, a link of their own.
Walking each computation in its scheduled order (loop bodies times their
trip count), an asynchronous collective runs from its start while the
instructions scheduled before its done compute; what is not finished by the
done is waited for (exposed). A synchronous collective is all exposed.

The estimate is a bound of the kind rooflines give: elementwise work inside
fusions, latencies and link contention are not modelled, and a collective
is assumed to use all of a chip's interconnect bandwidth.
"""

import dataclasses
import functools
import math
import re
from typing import Optional
from typing import Sequence

import numpy as np

from vit_jax.performance import communication
from vit_jax.performance import hlo

# Instructions that move no data of their own.
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast",
    "after-all", "partition-id", "replica-id", "opt-barrier", "while", "call",
    "conditional", "add-dependency", "domain", "copy-done", "async-done",
    "call-start", "call-done", "all-gather-done", "all-reduce-done",
    "collective-permute-done", "send-done", "recv-done"
}
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")


@dataclasses.dataclass(frozen=True)
class Rates:
  """Per device: dense bf16 FLOP/s, HBM, interconnect and DCN bytes/s
  (DCN None: not known, its transfers not timed)."""
  flops: float
  hbm: float
  ici: float
  dcn: Optional[float] = None


@dataclasses.dataclass
class Time:
  """Seconds of one run of a computation, and what they are made of."""
  total: float = 0.0  # The walk's clock.
  compute: float = 0.0  # Sum of FLOPs / peak.
  memory: float = 0.0  # Sum of bytes / HBM bandwidth.
  communication: float = 0.0  # Sum of collective bytes / ICI bandwidth.
  dcn: float = 0.0  # Sum of collective bytes between slices / DCN's.
  exposed: float = 0.0  # Time waited for collectives.
  flops: float = 0.0
  bytes_accessed: float = 0.0

  def add(self, other: "Time", times: int = 1):
    for field in dataclasses.fields(self):
      setattr(self, field.name,
              getattr(self, field.name) + times * getattr(other, field.name))


def _valid_pairs(out_size, kernel_size, in_size, stride, pad_low, lhs_dilate,
                 rhs_dilate) -> int:
  """(output position, kernel position) pairs of one window dimension that
  read an input element (not padding, not a dilation hole)."""
  o = np.arange(out_size)[:, None]
  k = np.arange(kernel_size)[None, :]
  at = o * stride + k * rhs_dilate - pad_low  # In the dilated input.
  valid = (at >= 0) & (at <= (in_size - 1) * lhs_dilate) & (at % lhs_dilate
                                                            == 0)
  return int(valid.sum())


def _window(attributes: str, rank: int) -> dict[str, list[int]]:
  fields = {
      "size": [1] * rank,
      "stride": [1] * rank,
      "pad": [(0, 0)] * rank,
      "lhs_dilate": [1] * rank,
      "rhs_dilate": [1] * rank
  }
  match = _WINDOW.search(attributes)
  for item in (match.group(1).split() if match else ()):
    key, value = item.split("=")
    if key == "pad":
      fields["pad"] = [
          tuple(int(p) for p in v.split("_")) for v in value.split("x")
      ]
    elif key in fields:
      fields[key] = [int(v) for v in value.split("x")]
  return fields


def convolution_flops(instruction, computation) -> float:
  """Multiply-adds x 2 of a convolution, counting only the window
  positions that read input (XLA writes batched matmuls as convolutions
  whose padded windows are mostly empty)."""
  labels = _DIM_LABELS.search(instruction.attributes)
  lhs, rhs = (computation.by_name.get(o) for o in instruction.operands[:2])
  if not labels or lhs is None or rhs is None:
    return 0.0
  in_labels, kernel_labels, out_labels = labels.groups()
  in_shape, kernel_shape = lhs.arrays()[0][1], rhs.arrays()[0][1]
  out_shape = instruction.arrays()[0][1]
  spatial = sorted(c for c in out_labels if c.isdigit())
  window = _window(instruction.attributes, len(spatial))
  pairs = 1
  for i, digit in enumerate(spatial):
    pairs *= _valid_pairs(out_shape[out_labels.index(digit)],
                          kernel_shape[kernel_labels.index(digit)],
                          in_shape[in_labels.index(digit)], window["stride"][i],
                          window["pad"][i][0], window["lhs_dilate"][i],
                          window["rhs_dilate"][i])
  return (2.0 * out_shape[out_labels.index("b")] *
          out_shape[out_labels.index("f")] *
          kernel_shape[kernel_labels.index("i")] * pairs)


def dot_flops(instruction, computation) -> float:
  lhs = computation.by_name.get(instruction.operands[0])
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}",
                          instruction.attributes)
  if lhs is None:
    return 0.0
  shape = lhs.arrays()[0][1]
  dims = [int(d) for d in contracting.group(1).split(",") if d
         ] if contracting else []
  return 2.0 * math.prod(instruction.arrays()[0][1]) * math.prod(
      shape[d] for d in dims)


def _memoised(method):
  """Caches a Walk method's result per computation name, on the walk."""

  @functools.wraps(method)
  def cached(self, name):
    key = (method.__name__, name)
    if key not in self.memo:
      self.memo[key] = method(self, name)
    return self.memo[key]

  return cached


class Walk:
  """Times the computations of one compiled program."""

  def __init__(self, text: str, mesh_shape: dict[str, int], rates: Rates,
               slice_of: Optional[Sequence[int]] = None):
    self.computations = hlo.parse_module(text)
    self.mesh_shape, self.num_devices, self.slice_of = (
        communication.program_mesh(text, mesh_shape, slice_of))
    self.rates = rates
    self.memo = {}

  @_memoised
  def flops(self, name: str) -> float:
    """FLOPs of a fused computation (nested fusions included)."""
    computation = self.computations[name]
    total = 0.0
    for instruction in computation.instructions:
      if instruction.opcode == "dot":
        total += dot_flops(instruction, computation)
      elif instruction.opcode == "convolution":
        total += convolution_flops(instruction, computation)
      elif instruction.opcode == "fusion":
        total += sum(self.flops(c) for c in _called(instruction))
    return total

  @_memoised
  def collectives_in(self, name: str) -> tuple:
    """(channel, bytes, over DCN) of the collectives inside a fused
    computation."""
    computation = self.computations[name]
    found = []
    for instruction in computation.instructions:
      measured = self._measure(instruction, computation)
      if measured:
        _, sent, _, dcn = measured
        found.append((communication.channel(instruction, name), sent, dcn))
      if instruction.opcode == "fusion":
        for callee in _called(instruction):
          found.extend(self.collectives_in(callee))
    return tuple(found)

  @_memoised
  def time(self, name: str) -> Time:
    """One run of a computation (not a fused one), walked in order."""
    computation = self.computations[name]
    clock = Time()
    link_free = {False: 0.0, True: 0.0}  # ICI's and DCN's.
    in_flight: dict[str, float] = {}  # Channel -> when its transfer ends.
    last_piece = {}  # Channel -> index of its last piece here (its done).
    pieces = []
    for index, instruction in enumerate(computation.instructions):
      pieces.append(self._collective_pieces(instruction, computation))
      for channel, _, _ in pieces[-1]:
        last_piece[channel] = index
    for index, instruction in enumerate(computation.instructions):
      if instruction.opcode == "while":
        called = dict(
            re.findall(r"\b(body|condition)=%([\w.\-]+)",
                       instruction.attributes))
        trips = hlo.runs(instruction, self.computations, computation)
        clock.add(self.time(called["body"]), trips)
        clock.add(self.time(called["condition"]), trips + 1)
        continue
      if instruction.opcode in ("call", "conditional"):
        for callee in _called(instruction) + _branches(instruction):
          clock.add(self.time(callee))
        continue
      work = self._work(instruction, computation)
      clock.flops += work[0]
      clock.bytes_accessed += work[1]
      compute, memory = work[0] / self.rates.flops, work[1] / self.rates.hbm
      clock.compute += compute
      clock.memory += memory
      for channel, sent, dcn in pieces[index]:
        # An unknown DCN rate times its transfers as free (not estimated).
        rate = (self.rates.dcn or math.inf) if dcn else self.rates.ici
        duration = sent / rate
        if channel in in_flight:
          if last_piece[channel] == index:  # Its done: wait for it.
            wait = max(0.0, in_flight.pop(channel) - clock.total)
            clock.total += wait
            clock.exposed += wait
          continue
        start = max(clock.total, link_free[dcn])
        link_free[dcn] = start + duration
        if dcn:
          clock.dcn += duration
        else:
          clock.communication += duration
        if last_piece[channel] == index and not instruction.opcode.endswith(
            "-start"):  # Synchronous: the step waits for it.
          clock.exposed += link_free[dcn] - clock.total
          clock.total = link_free[dcn]
        else:
          in_flight[channel] = link_free[dcn]
      clock.total += max(compute, memory)
    return clock

  def _measure(self, instruction, computation):
    return communication.measure(instruction, computation, self.mesh_shape,
                                 self.num_devices, self.slice_of)

  def _collective_pieces(self, instruction, computation):
    """(channel, bytes, over DCN) of collectives this instruction starts,
    continues or ends: itself, a `-done` (its start's channel), or fused
    ones."""
    if instruction.opcode.endswith("-done"):
      start = computation.by_name.get(instruction.operands[0])
      if start is not None and communication.megascale_recv(start):
        return [(communication.channel(start, computation.name), 0.0, True)]
      if start is not None:  # Ends its start's transfer, if it had one.
        moved = self._collective_pieces(start, computation)
        return [(communication.channel(start, computation.name), 0.0,
                 moved[0][2])] if moved else []
    measured = self._measure(instruction, computation)
    if measured:
      _, sent, _, dcn = measured
      return [(communication.channel(instruction, computation.name), sent, dcn)]
    if instruction.opcode == "call-start":  # An async call (TPU7x runs its
      # large collectives on its SparseCores so): one transfer, start to done.
      inside = [
          piece for callee in re.findall(r"\bto_apply=%([\w.\-]+)",
                                         instruction.attributes)
          for piece in self.collectives_in(callee)
      ]
      sent = sum(piece[1] for piece in inside)
      return [(communication.channel(instruction, computation.name), sent,
               any(piece[2] for piece in inside))] if sent else []
    if instruction.opcode in ("fusion", "async-start", "async-done"):
      return [
          piece for callee in _called(instruction)
          for piece in self.collectives_in(callee)
      ]
    return []

  def _work(self, instruction, computation) -> tuple[float, float]:
    """(FLOPs, bytes read and written) of one unfused instruction."""
    if instruction.opcode in _FREE:
      return 0.0, 0.0
    flops = 0.0
    if instruction.opcode == "fusion":
      flops = sum(self.flops(c) for c in _called(instruction))
    elif instruction.opcode == "dot":
      flops = dot_flops(instruction, computation)
    elif instruction.opcode == "convolution":
      flops = convolution_flops(instruction, computation)
    operands = [computation.by_name.get(o) for o in instruction.operands]
    sizes = [o.bytes if o is not None else 0.0 for o in operands]
    written = instruction.bytes
    if instruction.opcode == "dynamic-slice":
      sizes[0] = written  # Reads only the slice.
    elif instruction.opcode == "dynamic-update-slice":
      sizes[0], written = 0.0, sizes[1]  # Writes the update in place.
    elif instruction.opcode == "fusion":
      for callee in _called(instruction):
        sizes, written = self._in_place(callee, sizes, written)
    return flops, sum(sizes) + written

  @_memoised
  def _slicing(self, name: str) -> tuple[dict, Optional[float]]:
    """Of a fused computation: {parameter number: bytes read} for the
    parameters it only slices, and the bytes its root writes where the
    root updates a parameter in place (else None)."""
    computation = self.computations[name]
    numbers = {
        i.name: int(i.operand_text)
        for i in computation.instructions
        if i.opcode == "parameter"
    }
    users: dict[str, list] = {}
    for i in computation.instructions:
      for o in i.operands:
        users.setdefault(o, []).append(i)
    sliced = {}
    for param, number in numbers.items():
      uses = users.get(param, [])
      if uses and all(
          u.opcode == "dynamic-slice" and u.operands[0] == param for u in uses):
        sliced[number] = sum(u.bytes for u in uses)
    root = next((i for i in computation.instructions if i.is_root), None)
    updates = [root] if root is not None and root.opcode != "tuple" else [
        computation.by_name.get(o) for o in (root.operands if root else ())
    ]
    written = None
    if updates and all(u is not None and u.opcode == "dynamic-update-slice" and
                       u.operands[0] in numbers for u in updates):
      written = sum(computation.by_name[u.operands[1]].bytes for u in updates)
      for u in updates:
        sliced[numbers[u.operands[0]]] = 0.0
    return sliced, written

  def _in_place(self, name: str, sizes: list, written: float):
    sliced, in_place = self._slicing(name)
    sizes = [sliced.get(i, size) for i, size in enumerate(sizes)]
    return sizes, written if in_place is None else in_place


def _called(instruction) -> list[str]:
  return re.findall(r"\bcalls=%([\w.\-]+)", instruction.attributes)


def _branches(instruction) -> list[str]:
  match = re.search(r"branch_computations=\{([^}]*)\}", instruction.attributes)
  return re.findall(r"%([\w.\-]+)", match.group(1)) if match else []


def step_time(text: str, mesh_shape: dict[str, int], rates: Rates,
              slice_of: Optional[Sequence[int]] = None) -> dict:
  """The roofline parts of one step, per device, and the walk's estimate
  (`slice_of`: each mesh position's slice, where there are several; DCN's
  part is None where its rate is not known, and the estimate leaves it
  out)."""
  walk = Walk(text, mesh_shape, rates, slice_of)
  total = walk.time(hlo.entry(walk.computations).name)
  overlapped = None  # Rounding can take the exposed share past 1.
  if total.communication + total.dcn:
    overlapped = max(0.0, 1 - total.exposed / (total.communication + total.dcn))
  parts = {
      "compute_s": total.compute,
      "memory_s": total.memory,
      "interconnect_s": total.communication
  }
  dcn = total.dcn if rates.dcn else None
  timed = {**parts, "dcn_s": dcn or 0.0}
  return {
      **parts,
      "dcn_s": dcn,
      "bound": max(timed, key=timed.get)[:-2],
      "flops": total.flops,
      "bytes_accessed": total.bytes_accessed,
      "exposed_communication_s": total.exposed,
      "overlapped_fraction": overlapped,
      "est_step_s": total.total,
  }
