"""The Rotation Calculus: predicted time of each RoPE placement on a target.

Every placement runs the same attention; they differ in the work they add
(docs/cost-model.md derives each term):

* ``separate``: a pre-kernel that reads and writes Q, one that reads and writes K;
* ``hybrid``: the K pre-kernel, and Q rotated once per program in the kernel prologue;
* ``fused``: Q as in ``hybrid``, and each K tile rotated in the kernel once per q block
  that visits it (``gqa_pack`` query heads sharing one program share the rotation); on
  the Gluon forward each work item's first K tile in full (the pipeline fill) and the
  rest less what the kernel's K/V stream hides; on the Triton forward the extra
  whole-tile work of its taller q blocks.

A QK-norm moves with its side's RoPE: in a pre-kernel it adds no bytes (the same
pre-kernel reads and writes the row once); in the kernel each element the kernel
rotates is also normalized (:func:`norm_seconds`).

A pre-kernel costs its bytes over a fitted efficiency times the target's bandwidth,
plus :data:`LAUNCH_S`. An element transformed in the kernel costs :func:`rotation_seconds`
(FP32 vector work, a shared-memory round trip and the cos/sin table read from L2), or
:func:`norm_seconds`, times a fitted exposure, the part that nothing overlaps: one for
Q (rotated once per program) and, on sm_90's Gluon schedule, whose producer warpgroup
rotates each K tile beside the consumers' matmuls, one for K's rotation and one for
K's norm. The constants belong to the forward kernel that runs
(:class:`KernelConstants`): :data:`TRITON`, fitted to the Triton kernels on the H200
with the Gluon ones switched off (run 34), and :data:`HOPPER`, fitted to the Gluon
kernels (run 30's sweep; :mod:`attnfuse.cost.fit`). The kernel that transforms Q in the
Triton forward is slower by a fraction of the attention floor (``q_drag``).
:data:`LAUNCH_S` is an assumption (on those sweeps, whose batch x sequence is fixed, it
cannot be told apart from the pre-kernel bandwidth).
The backward (:func:`backward_work`) rotates dQ and dK back for every placement and
recomputes the sides the forward did not save: K after `fused`, QK-normed sides always.
The cos/sin table is built once per shape class, so it is reported, not charged per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnfuse.analysis import bands
from attnfuse.analysis.bands import Band
from attnfuse.cost.target import Target

__all__ = [
    "HOPPER",
    "HOPPER_FUSED_TILES",
    "KERNEL_STORE_EXPOSURE",
    "LAUNCH_S",
    "PLACEMENTS",
    "TRITON",
    "TRITON_WIDE",
    "AttentionShape",
    "KernelConstants",
    "Work",
    "added_work",
    "backward_work",
    "Prediction",
    "choose",
    "crossover",
    "crossover_closed_form",
    "extra_at_tokens",
    "fused_tile_seconds",
    "fused_tiles",
    "norm_seconds",
    "predict",
    "rotation_seconds",
    "tile_flops",
    "visited_kv_rows",
]

PLACEMENTS = ("fused", "hybrid", "separate")


@dataclass(frozen=True)
class KernelConstants:
    """The fitted constants of one forward kernel family."""

    rotation_exposure: float
    """Exposed in-kernel rotation time / :func:`rotation_seconds` of Q (rotated once per
    program, in its prologue) and, unless :attr:`k_rotation_exposure` says otherwise, of K."""
    prekernel_efficiency: float
    """A pre-kernel's achieved fraction of the target's bandwidth."""
    k_rotation_exposure: float | None = None
    """The same for K tiles transformed in the kernel once per visiting q block (`fused`);
    None: :attr:`rotation_exposure`."""
    k_norm_exposure: float | None = None
    """Exposed time / :func:`norm_seconds` of a K QK-norm in the kernel; None: the K
    rotation's exposure."""
    q_drag: float = 0.0
    """The attention kernel that transforms Q itself is slower by this fraction of the
    attention floor (registers its main loop loses to the prologue's tiles)."""
    fill_exposure: float = 0.0
    """Exposed time / :func:`rotation_seconds` (plus :func:`norm_seconds` with a K
    QK-norm) of each work item's first K tile in `fused`: the producer transforms it
    before the consumers' first matmul can start (the pipeline fill); 0 for a kernel
    without a producer (Triton), whose rotation is in its main loop."""
    kv_slack: float = 0.0
    """The K rotation hides behind the kernel's own K/V stream: this many times the time
    to read K and V once from HBM is taken off the K rotation before its exposure."""
    tile_exposure: float = 0.0
    """Time of the whole-tile matmul work that `fused`'s own tiles add (a taller q block
    computes more of the causal diagonal and of a ragged last block) over its time at the
    target's matmul rate: the kernel's distance from peak. Nothing where `fused` has the
    other placements' tiles (the Gluon forward)."""

    @property
    def k_exposure(self) -> float:
        return self.rotation_exposure if self.k_rotation_exposure is None else self.k_rotation_exposure

    @property
    def k_norm(self) -> float:
        return self.k_exposure if self.k_norm_exposure is None else self.k_norm_exposure


TRITON = KernelConstants(rotation_exposure=1.949, prekernel_efficiency=0.582, q_drag=0.0245, tile_exposure=1.626)
"""Fitted to the Triton kernels on an H200 with sm_90's Gluon kernels switched off (run 34's
Triton-only sweep: 156 cases of six families, head dims 64 and 128, S = 256 .. 65536,
forward and forward + backward; one exposure for both sides). `fused`'s taller tiles cost
1.6x their FLOPs at the matmul rate (the kernel runs at about 60% of peak), and the kernel
that rotates Q is 2.5% of the attention floor slower (run 14's kernel, fitted alone: 2.23
and 0.545, no drag)."""
TRITON_WIDE = KernelConstants(rotation_exposure=1.949, prekernel_efficiency=0.582, q_drag=0.185, tile_exposure=1.626)
"""The Triton forward kernel at head dims above 128: as :data:`TRITON`, and the kernel
that rotates Q is 18.5% of the attention floor slower at every S (run 30's head-dim-256
family's median, forward, S = 256 .. 65536)."""
HOPPER = KernelConstants(rotation_exposure=1.648, prekernel_efficiency=0.816, k_rotation_exposure=0.674,
                         k_norm_exposure=19.78, fill_exposure=1.921, kv_slack=0.7)
"""Fitted to the sm_90 warp-specialized Gluon kernels on the H200 sweep: run 30's rounds
sweep (132 cases of six families, S = 256 .. 65536 where the Gluon forward takes S,
forward and forward + backward) with its S <= 1024 cases re-timed from CUDA graphs (run
35) and its S >= 16384 ones over 10 calls (run 34); refitted in run 31 with the saved Q
charged as :attr:`Work.kernel_store_bytes`, in run 33 without the S = 320 and 448 cases,
which ran the Triton kernels, in session 34 with the pipeline fill and the K/V slack, and
in session 35 on the re-timed cases. The pre-kernel efficiency is held at run 26's 0.816
(run 27's per-kernel profile: 0.82 for the K, 0.92 for the Q pre-kernel at S = 4096).
K tiles rotated by the producer warpgroup beside the matmuls are partly hidden (0.67,
after 0.7 K/V stream times of slack), each work item's first one is not (1.9: the
consumers wait for it), Q rotated in the consumers' prologue is not (1.65); a K QK-norm
in the producer costs 20x its FLOP count (a row reduction per visit). The slack is the
least-squares residual's minimum over 0 .. 3 in steps of 0.1 (1.3 on run 30's eager
timings alone)."""
HOPPER_FUSED_TILES = (128, 128)
"""(q rows, keys) per K visit of the Gluon forward that rotates K (`fused`): a CTA's
work item is 128 q rows of one head; its producer rotates each 128-key tile once."""
KERNEL_STORE_EXPOSURE = 0.5
"""Exposed fraction of a store stream the attention kernel issues beside its matmuls
(:attr:`Work.kernel_store_bytes`, timed at the target's bandwidth): run 30's medians of
forward + backward `hybrid - separate` less the forward's, per family over S = 256 ..
16384, are 0.39-1.07 of the full store time (median 0.51, six families)."""
LAUNCH_S = 3e-6
"""Assumed GPU-side cost of one extra dependent kernel launch, seconds (not fitted)."""

ROT_FLOPS = 3.0
"""FP32 FLOPs per rotated element: x*cos + rotate_half(x)*sin (a multiply and an FMA)."""
TABLE_BYTES = 2.0
"""cos/sin table bytes read per rotated element (bf16, each table half-width)."""
NORM_FLOPS = 4.0
"""FP32 FLOPs per QK-normalized element: the square-accumulate FMA (2), the scale by the
row's reciprocal RMS and the weight (1 each); one rsqrt per row on top."""

_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: sizes, mask and kernel tiles."""

    batch: int
    q_heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    dtype: str = "bf16"
    causal: bool = True
    window: int | None = None
    """Keys visible before each query (sliding window), None for no window."""
    block_m: int = 128
    block_n: int = 128
    gqa_pack: int = 1
    """Query heads of one GQA group that one program serves (1 in today's kernels)."""
    fused_block_m: int = 256
    fused_block_n: int = 64
    """The tiles of a kernel that transforms K itself (`fused`): mask-tiling gives it
    taller q blocks (`default_block_sizes`), which halves its K visits;
    :data:`HOPPER_FUSED_TILES` for the Gluon forward."""
    hopper: bool = False
    """The forward runs sm_90's warp-specialized Gluon schedule (constants :data:`HOPPER`)."""
    q_norm: bool = False
    k_norm: bool = False
    """The side carries a QK-norm, placed with its RoPE."""

    def __post_init__(self) -> None:
        for what in ("batch", "q_heads", "kv_heads", "seq_len", "head_dim", "block_m", "block_n", "gqa_pack",
                     "fused_block_m", "fused_block_n"):
            if getattr(self, what) < 1:
                raise ValueError(f"{what} must be >= 1, got {getattr(self, what)}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads {self.q_heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.dtype not in _BYTES:
            raise ValueError(f"dtype must be one of {', '.join(_BYTES)}, got {self.dtype}")

    @property
    def constants(self) -> KernelConstants:
        """The fitted constants of the forward kernel this shape runs."""
        if self.hopper:
            return HOPPER
        return TRITON_WIDE if self.head_dim > 128 else TRITON

    @property
    def group(self) -> int:
        """Query heads per KV head (the GQA group)."""
        return self.q_heads // self.kv_heads

    @property
    def elem_bytes(self) -> int:
        return _BYTES[self.dtype]

    def with_seq_len(self, seq_len: int, *, keep_tokens: bool = False) -> AttentionShape:
        """This shape at another S; ``keep_tokens`` keeps batch x S (at least batch 1).
        The kernel stays (`hopper`): a Gluon shape moved to an S the Gluon forward does
        not take (`program_shape.gluon_takes`) must come from `shape_of` instead;
        :func:`crossover` steps in whole 128-row blocks."""
        batch = max(1, self.batch * self.seq_len // seq_len) if keep_tokens else self.batch
        return AttentionShape(**{**self.__dict__, "seq_len": seq_len, "batch": batch})

    def with_batch(self, batch: int) -> AttentionShape:
        """This shape with another batch."""
        return AttentionShape(**{**self.__dict__, "batch": batch})


def visited_kv_rows(shape: AttentionShape) -> int:
    """Key rows one (batch, query head) program sequence loads: summed over q blocks,
    whole key tiles, causal / window tiles skipped as mask-tiling skips them."""
    band = Band(None if shape.window is None else -shape.window, 0 if shape.causal else None)
    return bands.visited_kv_rows(band, shape.seq_len, shape.seq_len, shape.block_m, shape.block_n)


def rotation_seconds(target: Target, dtype: str = "bf16") -> float:
    """Time to rotate one element in the kernel, before exposure: FP32 work, a
    shared-memory read and write of the element, the table read from L2."""
    b = _BYTES[dtype]
    return ROT_FLOPS / target.vector_f32_flops + 2 * b / target.smem_bw + TABLE_BYTES / target.l2_bw


def norm_seconds(target: Target, head_dim: int) -> float:
    """Time to QK-normalize one element in the kernel, before exposure: FP32 work and the
    row's rsqrt shared by its ``head_dim`` elements (the element is in registers for its
    rotation already: no memory traffic of its own)."""
    return NORM_FLOPS / target.vector_f32_flops + 1.0 / (head_dim * target.sfu_ops)


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds of one placement, split by where the time goes."""

    placement: str
    attention: float
    """The attention itself at the target's matmul rate (the same for every placement)."""
    prekernels: float
    in_kernel_rotation: float
    backward_transforms: float
    """The backward's RoPE / QK-norm pre- and post-kernels (:func:`backward_work`)."""
    table_build: float
    """One-time cos/sin table build per shape class (not in :attr:`total`)."""
    tiles: float = 0.0
    """The whole-tile work `fused`'s own tiles add (:attr:`KernelConstants.tile_exposure`)."""

    @property
    def extra(self) -> float:
        """Seconds this placement adds to the attention, forward."""
        return self.prekernels + self.in_kernel_rotation + self.tiles

    @property
    def total(self) -> float:
        return self.attention + self.extra + self.backward_transforms


@dataclass(frozen=True)
class Work:
    """What a placement adds to the forward attention, before any rate is applied."""

    rotated_elements: int
    """Elements rotated inside the attention kernel."""
    prekernel_bytes: int
    """Bytes the pre-kernels read and write."""
    launches: int
    """Extra kernel launches."""
    normed_elements: int = 0
    """Elements QK-normalized inside the attention kernel."""
    k_rotated_elements: int = 0
    k_normed_elements: int = 0
    """The K tiles' part of :attr:`rotated_elements` / :attr:`normed_elements`."""
    kernel_store_bytes: int = 0
    """Bytes the attention kernel itself writes beside its matmuls (the rotated Q it
    saves for the backward): a store stream at the target's bandwidth, partly hidden by
    the matmuls (:data:`KERNEL_STORE_EXPOSURE`), not a pre-kernel's."""
    k_fill_elements: int = 0
    """K elements of every work item's first tile (`fused`: :attr:`KernelConstants.fill_exposure`)."""
    kv_stream_bytes: int = 0
    """K and V bytes the kernel that rotates K reads from HBM, once each
    (:attr:`KernelConstants.kv_slack`)."""

    def in_kernel_seconds(self, target: Target, shape: AttentionShape) -> tuple[float, float, float]:
        """The in-kernel transforms' time before exposure: (Q side, K rotation, K norm)."""
        rot, norm = rotation_seconds(target, shape.dtype), norm_seconds(target, shape.head_dim)
        q_side = (rot * (self.rotated_elements - self.k_rotated_elements)
                  + norm * (self.normed_elements - self.k_normed_elements))
        return q_side, rot * self.k_rotated_elements, norm * self.k_normed_elements

    def fill_seconds(self, target: Target, shape: AttentionShape) -> float:
        """The work items' first K tiles' transforms, before exposure."""
        norm = norm_seconds(target, shape.head_dim) if shape.k_norm else 0.0
        return (rotation_seconds(target, shape.dtype) + norm) * self.k_fill_elements

    def k_rotation_past_slack(self, target: Target, shape: AttentionShape, kv_slack: float) -> float:
        """The K rotation's time before exposure less ``kv_slack`` times the kernel's K/V
        stream (:attr:`kv_stream_bytes` at the target's bandwidth), at least 0."""
        k_rot = self.in_kernel_seconds(target, shape)[1]
        return max(0.0, k_rot - kv_slack * self.kv_stream_bytes / target.bandwidth())

    def exposed_seconds(self, target: Target, shape: AttentionShape) -> float:
        """The in-kernel transforms' exposed time: each part times its exposure, the K
        rotation less the slack of the kernel's K/V stream."""
        k = shape.constants
        q_side, _, k_norm = self.in_kernel_seconds(target, shape)
        return (k.rotation_exposure * q_side + k.k_exposure * self.k_rotation_past_slack(target, shape, k.kv_slack)
                + k.k_norm * k_norm + k.fill_exposure * self.fill_seconds(target, shape))


def added_work(shape: AttentionShape, placement: str) -> Work:
    """The forward work ``placement`` adds (see the module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got '{placement}'")
    b, hq, hkv, s, d = shape.batch, shape.q_heads, shape.kv_heads, shape.seq_len, shape.head_dim
    per_head = 2 * b * s * d * shape.elem_bytes  # one read and one write of a head
    if placement == "separate":
        return Work(0, per_head * (hq + hkv), 2)
    q_rotation = b * hq * s * d
    q_normed = q_rotation if shape.q_norm else 0
    if placement == "hybrid":
        return Work(q_rotation, per_head * hkv, 1, q_normed)
    programs = b * (hq // shape.gqa_pack)
    k_visits = programs * visited_kv_rows(fused_tiles(shape)) * d
    k_normed = k_visits if shape.k_norm else 0
    first_tiles = programs * -(-s // shape.fused_block_m) * min(shape.fused_block_n, s) * d
    return Work(q_rotation + k_visits, 0, 0, q_normed + k_normed, k_visits, k_normed,
                k_fill_elements=first_tiles, kv_stream_bytes=per_head * hkv)


def _seconds(work: Work, shape: AttentionShape, target: Target) -> tuple[float, float]:
    """(pre-kernel seconds, exposed in-kernel rotation seconds) of ``work``."""
    k = shape.constants
    pre = (work.prekernel_bytes / (k.prekernel_efficiency * target.bandwidth()) + work.launches * LAUNCH_S
           + KERNEL_STORE_EXPOSURE * work.kernel_store_bytes / target.bandwidth())
    return pre, work.exposed_seconds(target, shape)


def backward_work(shape: AttentionShape, placement: str, *, saved_sides: bool = True) -> Work:
    """The RoPE / QK-norm work of the backward of ``placement``: dQ and dK rotated back
    after the backward kernels (every placement), and each side the forward did not
    save recomputed in a pre-kernel. A side is saved when RoPE alone transforms it
    (`lower-backward`'s `saved_sides`) and a pre-kernel computed it, or, for Q, the
    forward kernel, which then writes the rotated Q once (:attr:`Work.kernel_store_bytes`);
    K rotated in the kernel (`fused`) is recomputed. ``saved_sides=False``: the backward
    before run 23, which recomputed both sides for every placement."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got '{placement}'")
    b, hq, hkv, s, d = shape.batch, shape.q_heads, shape.kv_heads, shape.seq_len, shape.head_dim
    per_head = 2 * b * s * d * shape.elem_bytes
    post = per_head * (hq + hkv)
    if not saved_sides:
        return Work(0, 2 * post, 4)
    moved, launches, stored = post, 2, 0
    if shape.q_norm:
        moved, launches = moved + per_head * hq, launches + 1
    elif placement != "separate":
        stored = per_head * hq // 2
    if shape.k_norm or placement == "fused":
        moved, launches = moved + per_head * hkv, launches + 1
    return Work(0, moved, launches, kernel_store_bytes=stored)


def fused_tiles(shape: AttentionShape) -> AttentionShape:
    """``shape`` with the tiles of the kernel that transforms K itself (`fused`)."""
    return AttentionShape(**{**shape.__dict__, "block_m": shape.fused_block_m, "block_n": shape.fused_block_n})


def tile_flops(shape: AttentionShape) -> float:
    """Forward matmul FLOPs of the attention in ``shape``'s whole tiles (`block_m` x
    `block_n`, masked tiles skipped as mask-tiling skips them)."""
    return 4.0 * shape.batch * shape.q_heads * min(shape.block_m, shape.seq_len) * visited_kv_rows(shape) * shape.head_dim


def fused_tile_seconds(shape: AttentionShape, target: Target) -> float:
    """The whole-tile matmul work `fused`'s own tiles add over the other placements',
    at the target's matmul rate (before :attr:`KernelConstants.tile_exposure`)."""
    return (tile_flops(fused_tiles(shape)) - tile_flops(shape)) / target.matmul_flops(shape.dtype)


def predict(shape: AttentionShape, target: Target, placement: str, *, backward: bool = False,
            saved_sides: bool = True) -> Prediction:
    """Predicted time of ``placement`` (forward, or forward + backward; ``saved_sides``:
    see :func:`backward_work`)."""
    s, d, k = shape.seq_len, shape.head_dim, shape.constants
    flops, rate = tile_flops(shape), target.matmul_flops(shape.dtype)
    attention = flops / rate * (3.5 if backward else 1.0)
    pre, rotation = _seconds(added_work(shape, placement), shape, target)
    if placement != "separate":
        rotation += k.q_drag * flops / rate
    tiles = k.tile_exposure * fused_tile_seconds(shape, target) if placement == "fused" else 0.0
    bwd = 0.0
    if backward:
        bwd = _seconds(backward_work(shape, placement, saved_sides=saved_sides), shape, target)[0]
    table = s * d / target.sfu_ops + s * d * 2 / target.bandwidth()
    return Prediction(placement, attention, pre, rotation, bwd, table, tiles)


def choose(shape: AttentionShape, target: Target, *, backward: bool = False, saved_sides: bool = True) -> str:
    """The placement with the smallest predicted time (ties: the earlier in PLACEMENTS)."""
    return min(PLACEMENTS, key=lambda p: predict(shape, target, p, backward=backward, saved_sides=saved_sides).total)


def extra_at_tokens(shape: AttentionShape, target: Target, placement: str, seq_len: int) -> float:
    """Forward seconds ``placement`` adds at ``seq_len`` with batch x S held at the
    shape's tokens (the batch may come out fractional: work scales, launches do not)."""
    one = predict(shape.with_seq_len(seq_len).with_batch(1), target, placement).extra
    two = predict(shape.with_seq_len(seq_len).with_batch(2), target, placement).extra
    per_sequence, fixed = two - one, 2 * one - two
    return shape.batch * shape.seq_len / seq_len * per_sequence + fixed


def crossover(
    shape: AttentionShape, target: Target, a: str = "fused", b: str = "hybrid", *, hi: int = 1 << 22
) -> int | None:
    """The smallest S, a multiple of ``fused_block_m`` (batch x S held fixed), at which
    ``a`` no longer beats ``b`` in the forward, by bisection on the predicted times; None
    if ``a`` beats ``b`` nowhere or everywhere on [fused_block_m, hi]."""
    bm = shape.fused_block_m

    def a_wins(blocks: int) -> bool:
        s = blocks * bm
        return extra_at_tokens(shape, target, a, s) < extra_at_tokens(shape, target, b, s)

    lo, up = 1, max(1, hi // bm)
    if not a_wins(lo) or a_wins(up):
        return None
    while up - lo > 1:
        mid = (lo + up) // 2
        lo, up = (mid, up) if a_wins(mid) else (lo, mid)
    return up * bm


def crossover_closed_form(shape: AttentionShape, target: Target, b: str = "hybrid") -> float:
    """The crossover of ``fused`` against ``b`` for a causal mask without window, in
    closed form (docs/cost-model.md), with launches spread over batch x S tokens.

    Per token and head-dim column, with ``x = S/BM + 1`` (BM ``fused``'s own q block
    ``fused_block_m``), ``fused`` adds ``E_k max(0, r x - s) + a_n x + f``: its K visits
    rotated (``r = c Hq/P / 2``, less the slack ``s`` of the kernel's K/V stream), normed
    with a K QK-norm (``a_n``), the work items' first tiles and the whole-tile work of
    its taller q block (``f``, both constant per token), while ``hybrid`` adds
    ``2 Hkv b / (eff BW)`` (the K pre-kernel) plus a launch; ``separate`` also the Q
    pre-kernel and a launch, less the Q transforms (``c_q``) and the kernel's drag that
    ``fused`` keeps (the drag grows with S: it joins ``a_n``). Negative (or -inf):
    ``fused`` wins at no S.
    """
    if not shape.causal or shape.window is not None:
        raise ValueError("the closed form covers causal masks without a window")
    n, d, hq, hkv = shape.batch * shape.seq_len, shape.head_dim, shape.q_heads, shape.kv_heads
    k, rate, bm = shape.constants, target.matmul_flops(shape.dtype), shape.fused_block_m
    rotation, norm = rotation_seconds(target, shape.dtype), norm_seconds(target, d)
    c_q = k.rotation_exposure * (rotation + (norm if shape.q_norm else 0.0))
    k_norm = norm if shape.k_norm else 0.0
    programs = hq / shape.gqa_pack
    r, a_n = rotation * programs / 2, k.k_norm * k_norm * programs / 2
    const = (k.fill_exposure * (rotation + k_norm) * programs * shape.fused_block_n / bm
             + k.tile_exposure * 2 * hq * (bm - shape.block_m) / rate)  # tile FLOPs per token: 2 Hq (S + BM)
    slack = k.kv_slack * 2 * hkv * shape.elem_bytes / target.bandwidth()
    bw = shape.constants.prekernel_efficiency * target.bandwidth()
    pre = 2 * hkv * shape.elem_bytes / bw + LAUNCH_S / (n * d)
    if b == "separate":
        pre += 2 * hq * shape.elem_bytes / bw + LAUNCH_S / (n * d) - c_q * hq
        drag = k.q_drag * 2 * hq / rate  # per token: q_drag x the floor, 2 Hq (S + block_m) / rate
        a_n, const = a_n + drag * bm, const + drag * (shape.block_m - bm)
    elif b != "hybrid":
        raise ValueError(f"b must be hybrid or separate, got '{b}'")
    kink = slack / r  # x below which the K/V stream hides the whole K rotation
    if a_n * kink + const >= pre:  # fused stops winning before the rotation shows
        x = (pre - const) / a_n if a_n else -math.inf
    else:
        x = (pre - const + k.k_exposure * slack) / (k.k_exposure * r + a_n)
    return bm * (x - 1)
