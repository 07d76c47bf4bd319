"""HardwareConstants: a HardwareProfile converted once to SI units, plus the efficiency curves.

Profiles keep human units in their field names (``hbm_gbytes_per_s``); the cost model works in
bytes, seconds and FLOP/s only.  Nothing here imports torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

GB = 1e9


@dataclass(frozen=True)
class Tier:
    bytes_per_s: float  # achievable: link bandwidth x efficiency
    latency_s: float
    mesh_links: int = 0  # a full mesh of this many links (xGMI); 0 = a switch
    aggregate_nics: bool = False  # inter-node: a group's ranks on a node pool their NICs (NetworkTier.aggregate_nics)
    # in-node: bytes_per_s's scale by group size (NetworkTier.efficiency_by_group_size over its efficiency), as
    # (sizes, scales) increasing; () = one rate for every group
    size_scale: tuple = ()
    # in-node: a bridged pair's achievable bandwidth (NetworkTier.bridge_gbytes_per_s x bridge_efficiency): a group of
    # exactly two consecutive ranks runs at it (comm.tier_params' pair); 0 = no bridges
    pair_bytes_per_s: float = 0.0


# what `parplan calibrate` writes into a CPU self-calibration's `measured` (both modes): a profile for tool tests
TEST_ONLY_MARK = "FOR TESTING ONLY"


@dataclass(frozen=True)
class HardwareConstants:
    name: str
    peak_flops: float  # dense matmul FLOP/s for the plan's dtype
    sustained: float  # profile.sustained_matmul_fraction
    mm_log_gflop: np.ndarray
    mm_eff: np.ndarray
    attn_seq: np.ndarray
    attn_eff: np.ndarray
    hbm_bytes: float
    hbm_bytes_per_s: float  # achievable
    reserve_bytes: float
    gpus_per_node: int
    nvlink: Tier
    inter_node: Tier
    host_memory_bytes_per_node: float
    host_link_bytes_per_s: float
    host_memory_bytes_per_s_per_node: float
    host_block_s: np.ndarray  # host dispatch seconds per block fwd+bwd, indexed by recompute code (0 = not measured)
    host_fwd_share: np.ndarray = field(default_factory=lambda: np.zeros(4))  # host_block_s's forward share (0 = not measured)
    # host_block_s of a block with FP8 linears (parplan's runtime), by recompute code (0 = not measured: host_block_s)
    host_block_fp8_s: np.ndarray = field(default_factory=lambda: np.zeros(4))
    # a mixture of experts' eager block in parplan's runtime: dispatch = host_moe_block_s + local experts x
    # host_moe_expert_s, by recompute code (0 = not measured: host_block_s)
    host_moe_block_s: np.ndarray = field(default_factory=lambda: np.zeros(4))
    # a dense block parplan's runtime runs uncompiled (an MoE model's dense blocks, fused_elementwise off), by
    # recompute code (0 = not measured: host_block_s)
    host_block_eager_s: np.ndarray = field(default_factory=lambda: np.zeros(4))
    host_moe_expert_s: np.ndarray = field(default_factory=lambda: np.zeros(4))
    overlap_slowdown: float = 0.0  # profile.overlap_compute_slowdown
    optimizer_bw_fraction: float = 1.0  # profile.optimizer_bandwidth_fraction
    optimizer_host_per_tensor_s: float = 0.0  # profile.optimizer_host_per_tensor_s
    fa2_peak_flops: float = 0.0  # profile.flash_attention_2_tflops in FLOP/s (0 = not published)
    # an FP8 plan (Training.fp8): the blocks' linear layers multiply at the profile's fp8 peak (compute.linear_gemm_time)
    fp8_peak_flops: float = 0.0  # 0: the plan is not FP8
    fp8_matmul_scale: float = 1.0  # profile.fp8_matmul_scale: an FP8 GEMM's efficiency over a 16-bit one's
    sustained_measured: bool = False  # `calibrate --from-run` or `--sustained` set it (profile.measured names it)
    test_only: bool = False  # a CPU self-calibration (`calibrate --device cpu`, or --host-only on a CPU): tool tests only

    def exposed(self, comm_s, compute_s):
        """Seconds communication adds to compute it overlaps with: max(C, X + C k/(1+k)) - X for a
        slowdown k of the compute while the collective runs (k = 0: max(0, C - X), perfect overlap)."""
        share = self.overlap_slowdown / (1.0 + self.overlap_slowdown)
        return np.maximum(share * comm_s, comm_s - compute_s)

    @property
    def usable_bytes(self) -> float:
        return self.hbm_bytes - self.reserve_bytes

    @property
    def linear_peak_flops(self) -> float:
        """Peak FLOP/s of the blocks' linear layers' GEMMs: the fp8 peak under an FP8 plan, else the dtype's."""
        return self.fp8_peak_flops or self.peak_flops

    @property
    def linear_efficiency_scale(self) -> float:
        """What multiplies the matmul curve's efficiency for the linear layers' GEMMs (1.0 unless the plan is FP8)."""
        return self.fp8_matmul_scale if self.fp8_peak_flops else 1.0

    def matmul_efficiency(self, flops):
        """Fraction of peak a GEMM of `flops` FLOPs reaches (profile curve, log-interpolated, clamped)."""
        x = np.log10(np.maximum(np.asarray(flops, dtype=float), 1.0) / 1e9)
        return self.sustained * np.interp(x, self.mm_log_gflop, self.mm_eff)

    def attention_efficiency(self, seq_len):
        return self.sustained * np.interp(np.asarray(seq_len, dtype=float), self.attn_seq, self.attn_eff)


def _by_recompute(per_mode: dict, selective_from: str | None = None) -> np.ndarray:
    """A profile's per-recompute-mode host field as an array indexed by recompute code (0 = not measured);
    selective-op re-dispatches nearly every op of the block, as full does: full's value unless measured.
    selective_from: the mode whose value selective takes unless measured (the MoE probe measures none and full
    only; selective recompute re-dispatches the attention core alone)."""
    sel = per_mode.get("selective", per_mode.get(selective_from, 0.0) if selective_from else 0.0)
    return np.array([per_mode.get("none", 0.0), sel, per_mode.get("full", 0.0),
                     per_mode.get("selective-op", per_mode.get("full", 0.0))])


def _size_scale(tier) -> tuple:
    """(group sizes, scales of the tier's bytes_per_s) from NetworkTier.efficiency_by_group_size; () without it."""
    table = tier.efficiency_by_group_size
    if not table:
        return ()
    return (tuple(int(k) for k, _ in table), tuple(e / tier.efficiency for _, e in table))


def constants_from_profile(profile, dtype: str = "bf16", gpus_per_node: int | None = None,
                           inter_node_gbytes_per_s: float | None = None,
                           aggregate_nics: bool | None = None, fp8: bool = False) -> HardwareConstants:
    """Convert a HardwareProfile (planner.schema) to SI units for one dtype, applying CLI overrides.  fp8: the plan
    runs its linear layers' GEMMs in FP8 (Training.fp8), at the profile's fp8 peak."""
    peaks = profile.peak_dense_tflops
    if fp8 and "fp8" not in peaks:
        raise ValueError(f"hardware profile {profile.name} has no fp8 peak (it lists {sorted(peaks)}): FP8 tensor cores "
                         "came with Hopper (H100, H200) and Blackwell (B200, GB200) and MI300X; plan without --fp8, or "
                         "add fp8 to the profile's peak_dense_tflops")
    if dtype not in peaks:
        # what selects each peak (planner.core.compute_dtype: fp32 is the fp32 recipe's); tf32 and others no flag does
        flags = {"bf16": "--dtype bf16", "fp16": "--dtype fp16", "fp32": "--precision fp32"}
        other = [flags[k] for k in sorted(peaks) if k in flags]
        raise ValueError(f"hardware profile {profile.name} has no peak for dtype {dtype}; it lists {sorted(peaks)}: "
                         f"add {dtype} to its peak_dense_tflops" + (f", or train with {' or '.join(other)}" if other
                                                                   else ""))
    curve = sorted(profile.matmul_efficiency_curve)
    attn = sorted(profile.attention_efficiency_curve)
    inter = profile.inter_node
    inter_bw = (inter_node_gbytes_per_s if inter_node_gbytes_per_s else inter.gbytes_per_s) * GB * inter.efficiency
    return HardwareConstants(
        name=profile.name,
        peak_flops=peaks[dtype] * 1e12,
        sustained=profile.sustained_matmul_fraction,
        sustained_measured="sustained_matmul_fraction" in (profile.measured or ""),
        test_only=TEST_ONLY_MARK in (profile.measured or ""),
        mm_log_gflop=np.array([math.log10(g) for g, _ in curve]),
        mm_eff=np.array([e for _, e in curve]),
        attn_seq=np.array([s for s, _ in attn], dtype=float),
        attn_eff=np.array([e for _, e in attn]),
        hbm_bytes=profile.hbm_gbytes * GB,
        hbm_bytes_per_s=profile.hbm_gbytes_per_s * GB * profile.hbm_efficiency,
        reserve_bytes=profile.memory_reserve_gbytes * GB,
        gpus_per_node=gpus_per_node or profile.gpus_per_node,
        nvlink=Tier(profile.nvlink.gbytes_per_s * GB * profile.nvlink.efficiency, profile.nvlink.latency_s,
                    profile.nvlink.mesh_links or 0, size_scale=_size_scale(profile.nvlink),
                    pair_bytes_per_s=(profile.nvlink.bridge_gbytes_per_s or 0.0) * GB
                    * (profile.nvlink.bridge_efficiency or 0.0)),
        inter_node=Tier(inter_bw, inter.latency_s, aggregate_nics=bool(inter.aggregate_nics if aggregate_nics is None else aggregate_nics)),
        host_memory_bytes_per_node=profile.host_memory_gbytes_per_node * GB,
        host_link_bytes_per_s=profile.host_link_gbytes_per_s * GB,
        host_memory_bytes_per_s_per_node=profile.host_memory_gbytes_per_s_per_node * GB,
        host_block_s=_by_recompute(profile.host_block_s),
        host_fwd_share=_by_recompute(profile.host_forward_share),
        host_block_fp8_s=_by_recompute(profile.host_block_fp8_s),
        host_moe_block_s=_by_recompute(profile.host_moe_block_s, selective_from="none"),
        host_block_eager_s=_by_recompute(profile.host_block_eager_s, selective_from="none"),
        host_moe_expert_s=_by_recompute(profile.host_moe_expert_s, selective_from="none"),
        overlap_slowdown=profile.overlap_compute_slowdown,
        optimizer_bw_fraction=profile.optimizer_bandwidth_fraction,
        optimizer_host_per_tensor_s=profile.optimizer_host_per_tensor_s,
        fa2_peak_flops=(profile.flash_attention_2_tflops or 0.0) * 1e12,
        fp8_peak_flops=peaks["fp8"] * 1e12 if fp8 else 0.0,
        fp8_matmul_scale=profile.fp8_matmul_scale,
    )
