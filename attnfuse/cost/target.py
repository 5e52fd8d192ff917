"""GPU targets: the device figures the cost model reads.

A :class:`Target` holds datasheet peaks (dense, no sparsity) and, where this project
measured them, overrides (:attr:`Target.measured_tensor_flops`,
:attr:`Target.measured_hbm_bw`) that the model prefers. Figures derived rather than
read from a datasheet (special-function and shared-memory rates, which NVIDIA gives
per SM per clock, times SMs times boost clock; L2 bandwidth) are marked so in
docs/cost-model.md, which cites the source of every row.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["TARGETS", "Target", "UnknownTargetError", "get_target", "known_targets", "target_for_device",
           "target_from_profile"]

T = 1e12
G = 1e9


@dataclass(frozen=True)
class Target:
    """One GPU as the cost model sees it (SI units: FLOP/s, bytes/s, bytes)."""

    name: str
    vendor: str
    sms: int
    """Streaming multiprocessors (NVIDIA) or compute units (AMD)."""
    clock_hz: float
    """Boost clock the peaks below assume."""
    tensor_flops: tuple[tuple[str, float], ...]
    """Dense tensor-core FLOP/s per input dtype (f32 means TF32 / XF32)."""
    vector_f32_flops: float
    """Non-tensor FP32 FLOP/s (an FMA counts 2)."""
    sfu_ops: float
    """Special-function (MUFU: sin, cos, exp2) results per second."""
    hbm_bw: float
    l2_bytes: int
    l2_bw: float
    smem_per_sm: int
    """Shared memory (LDS on AMD) a block can use per SM, bytes."""
    smem_bw: float
    """Shared-memory bandwidth of the whole chip, bytes/s."""
    regs_per_sm: int
    """32-bit registers per SM."""
    warp_specialized: bool = False
    """The sm_90 warp-specialized Gluon schedules (`lower-to-tile{hopper-forward}`) run
    on it (compute capability 9.x): its forward placements are predicted with the
    constants fitted to them (`attnfuse.cost.model.HOPPER`)."""
    measured_tensor_flops: float | None = None
    """bf16 dense matmul FLOP/s measured on this project's machine, if any."""
    measured_hbm_bw: float | None = None
    """Device copy bandwidth measured on this project's machine, if any."""

    def peak_tensor_flops(self, dtype: str) -> float:
        """Datasheet tensor-core FLOP/s for ``dtype`` (bf16, f16, f32)."""
        table = dict(self.tensor_flops)
        if dtype not in table:
            raise ValueError(f"{self.name}: no tensor-core rate for {dtype}; known: {', '.join(table)}")
        return table[dtype]

    def matmul_flops(self, dtype: str) -> float:
        """Tensor-core FLOP/s the model uses: measured (bf16/f16) if known, else peak."""
        if self.measured_tensor_flops is not None and dtype in ("bf16", "f16"):
            return self.measured_tensor_flops
        return self.peak_tensor_flops(dtype)

    def bandwidth(self) -> float:
        """HBM bytes/s the model uses: measured copy bandwidth if known, else peak."""
        return self.measured_hbm_bw if self.measured_hbm_bw is not None else self.hbm_bw

    def compute_to_bandwidth(self, dtype: str = "bf16") -> float:
        """FLOPs per byte at which a kernel turns from bandwidth- to compute-bound."""
        return self.matmul_flops(dtype) / self.bandwidth()


def _nv(
    name: str, sms: int, clock_ghz: float, bf16: float, f32_tc: float, f32: float,
    hbm: float, l2_mb: int, l2_bw: float, smem_kb: int, warp_specialized: bool = False, **measured: float,
) -> Target:
    """An NVIDIA target: 16 MUFU results and 128 shared-memory bytes per SM per clock."""
    clock = clock_ghz * G
    return Target(
        name=name, vendor="nvidia", sms=sms, clock_hz=clock,
        tensor_flops=(("bf16", bf16 * T), ("f16", bf16 * T), ("f32", f32_tc * T)),
        vector_f32_flops=f32 * T, sfu_ops=16 * sms * clock, hbm_bw=hbm * G,
        l2_bytes=l2_mb << 20, l2_bw=l2_bw * T, smem_per_sm=smem_kb << 10,
        smem_bw=128 * sms * clock, regs_per_sm=65536, warp_specialized=warp_specialized, **measured,
    )


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _nv("a100", 108, 1.41, 312, 156, 19.5, 2039, 40, 5.0, 164),
        _nv("h100-sxm", 132, 1.98, 989.4, 494.7, 66.9, 3350, 50, 10.0, 228, warp_specialized=True),
        _nv("h200", 132, 1.98, 989.4, 494.7, 66.9, 4800, 50, 10.0, 228, warp_specialized=True,
            measured_tensor_flops=790 * T, measured_hbm_bw=4300 * G),
        _nv("b200", 148, 1.965, 2250, 1100, 80, 8000, 126, 20.0, 228),
        _nv("rtx3090", 82, 1.695, 71, 35.6, 35.6, 936, 6, 2.5, 100),
        _nv("rtx4090", 128, 2.52, 165.2, 82.6, 82.6, 1008, 72, 5.0, 100),
        _nv("l4", 58, 2.04, 121, 60, 30.3, 300, 48, 2.0, 100),
        _nv("l40s", 142, 2.52, 362, 183, 91.6, 864, 96, 5.0, 100),
        Target(
            name="mi300x", vendor="amd", sms=304, clock_hz=2.1 * G,
            tensor_flops=(("bf16", 1307.4 * T), ("f16", 1307.4 * T), ("f32", 653.7 * T)),
            vector_f32_flops=163.4 * T, sfu_ops=16 * 304 * 2.1 * G, hbm_bw=5300 * G,
            l2_bytes=32 << 20, l2_bw=17.0 * T, smem_per_sm=64 << 10,
            smem_bw=128 * 304 * 2.1 * G, regs_per_sm=131072,
        ),
    )
}

_ALIASES = {"h100": "h100-sxm", "a100-sxm": "a100", "3090": "rtx3090", "4090": "rtx4090"}


class UnknownTargetError(ValueError):
    """A target name not in :data:`TARGETS`; the message lists the known ones."""


def known_targets() -> tuple[str, ...]:
    """Names accepted by :func:`get_target`, sorted (aliases not included)."""
    return tuple(sorted(TARGETS))


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "").replace(" ", "").replace("-", "")


_INDEX = {_key(n): n for n in TARGETS} | {_key(a): n for a, n in _ALIASES.items()}


def target_from_profile(profile: dict[str, Any], where: str = "profile") -> Target:
    """A target from a profile written by ``attnfuse-calibrate`` (JSON with
    :class:`Target`'s fields, ``tensor_flops`` a mapping from dtype to FLOP/s; its
    figures are measured, so they also fill the measured overrides; ``warp_specialized``
    is optional, false if absent)."""
    required = [f.name for f in fields(Target) if not f.name.startswith("measured_") and f.name != "warp_specialized"]
    missing = [name for name in required if name not in profile]
    if missing:
        raise UnknownTargetError(f"{where}: not a cost-model profile, missing {', '.join(missing)}")
    values = {name: profile[name] for name in required}
    try:
        values["tensor_flops"] = tuple((str(k), float(v)) for k, v in dict(profile["tensor_flops"]).items())
        for name in required:
            if name not in ("name", "vendor", "tensor_flops"):
                values[name] = type(getattr(TARGETS["h200"], name))(values[name])
    except (TypeError, ValueError) as e:
        raise UnknownTargetError(f"{where}: bad value in the profile ({e})") from None
    bf16 = dict(values["tensor_flops"]).get("bf16")
    return Target(**values, warp_specialized=bool(profile.get("warp_specialized", False)),
                  measured_tensor_flops=bf16, measured_hbm_bw=values["hbm_bw"])


@functools.lru_cache(maxsize=16)
def _profile(path: str, mtime: float) -> Target:
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UnknownTargetError(f"cannot read the target profile {path}: {e}") from None
    if not isinstance(profile, dict):
        raise UnknownTargetError(f"{path}: not a cost-model profile (a JSON object)")
    return target_from_profile(profile, path)


def get_target(name: str) -> Target:
    """The target called ``name`` (case, spaces, ``-`` and ``_`` ignored: ``H100_SXM``),
    or the profile at ``name`` when it ends in ``.json`` (``attnfuse-calibrate``)."""
    if name.endswith(".json"):
        path = Path(name).resolve()
        if not path.is_file():
            raise UnknownTargetError(f"target profile {name} does not exist (write one with attnfuse-calibrate)")
        return _profile(str(path), path.stat().st_mtime)
    found = _INDEX.get(_key(name))
    if found is None:
        raise UnknownTargetError(
            f"unknown target '{name}'; known targets: {', '.join(known_targets())}"
        )
    return TARGETS[found]


def target_for_device(device_name: str) -> Target | None:
    """The table's entry for a device as its driver names it (``torch.cuda.get_device_name``:
    "NVIDIA H200", "NVIDIA H100 80GB HBM3"): the longest target name or alias found in
    it (case, spaces, ``-`` and ``_`` ignored, so "l40s" wins over "l4"); None when none is."""
    key = _key(device_name)
    found = [name for name in _INDEX if name in key]
    return TARGETS[_INDEX[max(found, key=len)]] if found else None
