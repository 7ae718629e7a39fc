"""Reading a compiled XLA program (`compiled.as_text()`): its computations,
their instructions, shapes in bytes, and how often each computation runs.

What the plan's communication and time estimates are counted from. The text
is XLA's HLO after optimisation (scheduled, so the order of a computation's
instructions is the order they are issued). Only what the counts need is
parsed: names, result types, opcodes, operands and the attributes naming
called computations, replica groups and trip counts.
"""

import dataclasses
import functools
import math
import re
from typing import Optional

import numpy as np

DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "token": 0
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$")
# `%name = TYPE opcode(operands), attributes`; TYPE may be a tuple.
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass
class Instruction:
  name: str
  type: str  # The result type: `f32[8,128]{1,0}` or a tuple of them.
  opcode: str
  operands: list[str]
  attributes: str  # The rest of the line, after the operands.
  is_root: bool = False
  operand_text: str = ""  # Inside the parentheses (a constant's literal).

  @property
  def bytes(self) -> float:
    return type_bytes(self.type)

  def arrays(self) -> list[tuple[str, tuple[int, ...]]]:
    return arrays(self.type)


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  is_entry: bool = False

  @functools.cached_property
  def by_name(self) -> dict[str, Instruction]:
    return {i.name: i for i in self.instructions}


def arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """(dtype, shape) of each array of a (tuple) type; layouts ignored."""
  without_layouts = re.sub(r"\{[^{}]*\}", "", type_text)
  return [(dtype, tuple(int(d)
                        for d in dims.split(",")
                        if d))
          for dtype, dims in _ARRAY.findall(without_layouts)
          if dtype in DTYPE_BYTES]


def type_bytes(type_text: str) -> float:
  return sum(DTYPE_BYTES[dtype] * math.prod(shape)
             for dtype, shape in arrays(type_text))


def _split_operands(text: str) -> tuple[str, str]:
  """The text inside the opcode's parentheses, and what follows."""
  depth, end = 1, len(text)
  for i, char in enumerate(text):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      end = i
      break
  return text[:end], text[end + 1:]


def _parse_instruction(line: str) -> Optional[Instruction]:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  root, name, rest = match.groups()
  # The type ends where the opcode starts: the first ` word(` outside the
  # type's brackets (tuple types hold no such pattern).
  depth = 0
  for i, char in enumerate(rest):
    depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(char, 0)
    if depth == 0 and char == " ":
      opcode = _OPCODE.match(rest, i)
      if opcode:
        inside, attributes = _split_operands(rest[opcode.end():])
        operands = re.findall(r"%([\w.\-]+)", inside)
        return Instruction(name, rest[:i], opcode.group(1), operands,
                           attributes, bool(root), inside)
  return None


@functools.lru_cache(maxsize=2)  # The plan reads one program twice.
def parse_module(text: str) -> dict[str, Computation]:
  """{name: computation} of an HLO module's text (shared: do not modify)."""
  computations, current = {}, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = Computation(header.group(2), [], bool(header.group(1)))
      computations[current.name] = current
    elif line.startswith("}"):
      current = None
    elif current is not None:
      instruction = _parse_instruction(line)
      if instruction:
        current.instructions.append(instruction)
  return computations


def entry(computations: dict[str, Computation]) -> Computation:
  return next(c for c in computations.values() if c.is_entry)


def trip_count(loop: Instruction, computations: dict[str, Computation],
               caller: Computation) -> Optional[int]:
  """Iterations of a `while` in `caller`: the compiler's known_trip_count,
  else N - S for a condition `counter < N` (N a constant) whose counter
  goes up by 1 from S (what scans and fori_loops compile to). S is read
  from the loop's initial tuple where it is a constant (1 where XLA peeled
  the first iteration out of the loop), else taken as 0. None where the
  count is not known."""
  known = _TRIP_COUNT.search(loop.attributes)
  if known:
    return int(known.group(1))
  condition = computations.get(
      dict(_CALLED.findall(loop.attributes)).get("condition", ""))
  if condition is None:
    return None
  root = next((i for i in condition.instructions if i.is_root), None)
  if root is None or root.opcode != "compare" or ("direction=LT"
                                                  not in root.attributes):
    return None
  bound = _constant(condition, root.operands[-1])
  if bound is None:
    return None
  return max(bound - (_start(loop, condition, root, caller) or 0), 0)


def runs(loop: Instruction, computations: dict[str, Computation],
         caller: Computation) -> int:
  """How many times a `while`'s body runs: its trip count, else once."""
  trips = trip_count(loop, computations, caller)
  return 1 if trips is None else trips


def _start(loop: Instruction, condition: Computation, compare: Instruction,
           caller: Computation) -> Optional[int]:
  """The constant a loop's counter starts at, if the condition reads the
  counter straight from its parameter and the caller builds the loop's
  initial tuple from a constant there; else None."""
  counter = condition.by_name.get(compare.operands[0])
  if counter is None or counter.opcode != "get-tuple-element":
    return None
  parameter = condition.by_name.get(counter.operands[0])
  index = re.search(r"\bindex=(\d+)", counter.attributes)
  init = caller.by_name.get(loop.operands[0]) if loop.operands else None
  if (parameter is None or parameter.opcode != "parameter" or index is None or
      init is None or init.opcode != "tuple" or
      int(index.group(1)) >= len(init.operands)):
    return None
  return _constant(caller, init.operands[int(index.group(1))])


def _constant(computation: Computation, name: str) -> Optional[int]:
  """The integer a scalar constant holds, through copies; else None."""
  instruction = computation.by_name.get(name)
  while instruction is not None and instruction.opcode == "copy":
    instruction = computation.by_name.get(instruction.operands[0])
  if instruction is None or instruction.opcode != "constant":
    return None
  try:
    return int(instruction.operand_text)
  except ValueError:
    return None


def execution_counts(computations: dict[str, Computation]) -> dict[str, int]:
  """{computation: times it runs per execution of the program}. A while
  body runs trip-count times per run of its caller (once where the count is
  unknown); fusions and calls once; an async operation's or async call's
  computation once (at its start); each branch of a conditional once (an
  upper bound). Reducers (`to_apply`) are not counted."""
  callers: dict[str, list[tuple[str, int]]] = {}
  for computation in computations.values():
    for instruction in computation.instructions:
      if instruction.opcode in ("async-done", "async-update", "call-done"):
        continue  # Its computation is counted at the start.
      called = dict(_CALLED.findall(instruction.attributes))
      times = 1
      if instruction.opcode == "while":
        times = runs(instruction, computations, computation)
        callers.setdefault(called["condition"], []).append(
            (computation.name, times + 1))
        called.pop("condition")
      for key, callee in called.items():
        # A call-start runs its computation on another thread (TPU7x
        # offloads its large collectives to its SparseCores that way).
        if key != "to_apply" or instruction.opcode in ("call", "call-start"):
          callers.setdefault(callee, []).append((computation.name, times))
      branches = _BRANCHES.search(instruction.attributes)
      for callee in re.findall(r"%([\w.\-]+)",
                               branches.group(1) if branches else ""):
        callers.setdefault(callee, []).append((computation.name, 1))

  @functools.cache
  def count(name: str) -> int:
    if computations[name].is_entry:
      return 1
    return sum(count(caller) * times for caller, times in callers.get(name, ()))

  return {name: count(name) for name in computations}


def device_groups(attributes: str, num_devices: int) -> list[list[int]]:
  """The groups of device ids a collective runs over, from its
  `replica_groups` in any of XLA's three forms: explicit `{{0,1},{2,3}}`,
  iota `[2,2]<=[4]` (or `<=[2,2]T(1,0)`), and mesh axes
  `mesh['a'=2,'b'=2] {'a'}`. Empty: all devices in one group."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
  if mesh:
    axes = re.findall(r"'([^']+)'=(\d+)", mesh.group(1))
    names = [name for name, _ in axes]
    ids = np.arange(num_devices).reshape([int(size) for _, size in axes])
    grouped = [names.index(n) for n in re.findall(r"'([^']+)'", mesh.group(2))]
    rest = [i for i in range(len(names)) if i not in grouped]
    size = math.prod(ids.shape[i] for i in grouped)
    return np.transpose(ids, rest + grouped).reshape(-1, size).tolist()
  iota = re.search(
      r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?",
      attributes)
  if iota:
    shape = [int(d) for d in iota.group(1).split(",")]
    ids = np.arange(math.prod(shape)).reshape(
        [int(d) for d in iota.group(2).split(",")])
    if iota.group(3):
      ids = np.transpose(ids, [int(d) for d in iota.group(3).split(",")])
    return ids.reshape(shape[0], -1).tolist()
  explicit = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}",
                       attributes)
  groups = re.findall(r"\{([\d,\s]*)\}", explicit.group(1) if explicit else "")
  groups = [[int(d) for d in g.split(",") if d.strip()] for g in groups]
  return [g for g in groups if g] or [list(range(num_devices))]


def source_target_pairs(attributes: str) -> list[tuple[int, int]]:
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", attributes)
  if not pairs:
    return []
  return [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)",
                                                  pairs.group(1) + "}")]
