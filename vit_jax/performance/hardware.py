"""What we know of each accelerator: memory and dense bf16 peak, per chip.

Keyed by what JAX reports as `device.device_kind`. A TPU v5p reports
"TPU v5" and a v5e "TPU v5 lite", so the longest matching key wins. When a
chip shows up as several devices (a TPU v4 without megacore: one device
per TensorCore), each device gets its share.
"""

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Chip:
  hbm_gib: float  # High-bandwidth memory per chip.
  bf16_tflops: float  # Dense bf16 peak per chip.


CHIPS = {
    "TPU v4": Chip(32, 275),
    "TPU v5 lite": Chip(16, 197),  # v5e
    "TPU v5": Chip(95, 459),  # v5p
    "TPU v6 lite": Chip(32, 918),  # v6e (Trillium)
    "H100": Chip(80, 989),
    "H200": Chip(141, 989),
    "A100": Chip(40, 312),
    "A100-SXM4-80GB": Chip(80, 312),
    "A100 80GB": Chip(80, 312),
}


def chip_of(device_kind: str) -> Optional[Chip]:
  matches = [k for k in CHIPS if k in device_kind]
  return CHIPS[max(matches, key=len)] if matches else None


def hbm_bytes(device_kind: str, devices_per_chip: int = 1) -> Optional[int]:
  chip = chip_of(device_kind)
  return int(chip.hbm_gib * 2**30 / devices_per_chip) if chip else None


def peak_flops(device_kind: str, devices_per_chip: int = 1) -> Optional[float]:
  chip = chip_of(device_kind)
  return chip.bf16_tflops * 1e12 / devices_per_chip if chip else None
