"""Communication: alpha-beta time per collective and per network tier.

Ring algorithms (Patarasuk & Yuan 2009; NCCL): an all-reduce of B bytes over n ranks moves
2(n-1)/n * B per rank in 2(n-1) steps; all-gather and reduce-scatter move (n-1)/n * B in n-1
steps.  time = steps * latency + bytes_moved / bandwidth, with the tier's achievable bandwidth
(link bandwidth x efficiency, from the hardware profile).

Tier of a group: mesh order is (dp, pp, cp, tp), TP innermost.  Groups whose ranks span
`stride * size` consecutive ranks stay inside NVLink nodes when that span divides gpus_per_node
(or the job is one node); otherwise ring steps cross the inter-node tier.  So a TP group larger than
a node, or one that does not tile it (6 on 8-GPU nodes), pays InfiniBand/RoCE bandwidth: the planner
sees that.

Across nodes a collective is charged one NIC's bandwidth per rank (the profile's inter_node, per GPU),
unless the profile's inter-node tier sets aggregate_nics (or `--pool-nics`): NCCL can run a collective over
every NIC its ranks on a node own, one ring per channel, each entering and leaving the node through a different
NIC and passing the node's GPUs over NVLink ("data can flow from the NIC to the nearest GPU, go through all the
other GPUs through NVLink, then exit from the last GPU, back to the NIC. And we can have 4 of those flows running
concurrently", NVIDIA/nccl#412; "on an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure
192GB/s AllReduce BusBW", NVIDIA/nccl#812, where one card carries 25 GB/s).  Then a group with k ranks on each
node moves its ring at k times the per-GPU bandwidth, up to the node's fabric: a data-parallel group of every GPU
(FSDP over 64 GPUs) at 8 NICs' rate (H100: 8 x 44 = 352 GB/s against NVLink's 360; A100: 8 x 22 = 176 against
234), one with a rank per node (beside tp 8) at one NIC's.  Which the published runs saw is split
(benchmarks/nic_aggregation.py): MosaicML's 2023 FSDP runs suggest pooling (MPT-13B at micro-batch 2 ran as fast
a GPU on 64 H100s as on 8, which takes at least 90-120 GB/s of FSDP traffic a GPU); the Selene and EOS runs the
profiles are fitted and checked on are fitted better without it (DeepSpeed's 2021 ZeRO-3 rows ran at ~21 GB/s a
GPU, as its stage-3 gather of that time did even over NVLink: deepspeedai/DeepSpeed#1174, #1188), so it is off
by default.  Point-to-point transfers (pipeline sends, ring attention's K/V) use their own GPU's NIC either way.
A ring with more than one rank on a node passes that node's fabric between them too, so it is no faster than the
fabric gives such a group (a custom node with slow PCIe between its GPUs and a fast NIC each; no shipped profile).
"""
from __future__ import annotations

import numpy as np


def tier_params(hw, inside_node, size=None, local=1, pair=False):
    """(bandwidth, latency) of a group of `size` ranks: its node's fabric inside a node; across nodes one NIC's
    bandwidth, or where the profile's inter-node tier aggregates NICs, `local` NICs' for a group with that many ranks
    on each node (ranks_per_node), no faster than the node's fabric and never slower than one NIC.  On a full mesh
    (xGMI: hw.nvlink.mesh_links) a group of k ranks drives k - 1 of the links and a point-to-point transfer
    (size 2) one; a switch gives every group the full bandwidth; a node with a rate by group size
    (hw.nvlink.size_scale: a PCIe tree) gives each group its size's; a node whose GPUs are bridged in pairs
    (hw.nvlink.pair_bytes_per_s) gives a group that is one pair (`pair`: one_pair) the bridge's."""
    intra = _intra(hw, size, pair)
    inter = hw.inter_node.bytes_per_s
    if hw.inter_node.aggregate_nics:  # never below one NIC (a point-to-point pair on a mesh drives one xGMI link)
        inter = np.maximum(inter, np.minimum(intra, np.asarray(local) * inter))
    # a ring across nodes with more than one rank on a node passes that node's fabric between them as well: no faster
    # than the fabric gives a group of those ranks (no shipped profile's network outruns its node's: a custom profile
    # with slow PCIe between its GPUs and a fast NIC each)
    local = np.asarray(local)
    inter = np.where(local > 1, np.minimum(inter, _intra(hw, np.maximum(local, 2), False)), inter)
    bw = np.where(inside_node, intra, inter)
    lat = np.where(inside_node, hw.nvlink.latency_s, hw.inter_node.latency_s)
    return bw, lat


def _intra(hw, size, pair):
    """The node's fabric's bandwidth for a group of `size` ranks inside it (tier_params)."""
    intra = hw.nvlink.bytes_per_s
    links = hw.nvlink.mesh_links
    if links and size is not None:
        intra = intra * np.clip(np.asarray(size) - 1, 1, links) / links
    if hw.nvlink.size_scale and size is not None:  # the node's rate by group size (a PCIe tree: the L40S profile)
        intra = intra * size_scale(hw.nvlink.size_scale, size)
    if hw.nvlink.pair_bytes_per_s:  # NVLink bridges between pairs (the H100 PCIe profile)
        intra = np.where(pair, hw.nvlink.pair_bytes_per_s, intra)
    return intra


def one_pair(stride, size):
    """True where a group of `size` ranks `stride` apart is one pair of consecutive ranks (2i, 2i + 1: a bridged
    pair, tier_params' pair): two ranks, nothing between them."""
    return (np.asarray(size) == 2) & (np.asarray(stride) == 1)


def size_scale(table, size):
    """A tier's bandwidth scale for groups of `size` ranks (Tier.size_scale: sizes and scales, increasing): the entry
    of the largest listed size at or below each, the first entry below the first size."""
    sizes, scales = table
    i = np.searchsorted(np.asarray(sizes), np.asarray(size), side="right") - 1
    return np.asarray(scales)[np.clip(i, 0, len(sizes) - 1)]


def group_inside_node(hw, stride, size, gpus=None):
    """True where every group of `size` ranks `stride` apart lies inside one node.  The groups tile the
    ranks in blocks of stride x size, so that span must divide the node's GPUs: a tensor-parallel group
    of 6 on 8-GPU nodes puts ranks 6-11 across two nodes, and the collectives wait for the slowest
    group.  A job of at most one node (`gpus`) has every group inside it."""
    span = np.asarray(stride) * np.asarray(size)
    gpn = hw.gpus_per_node
    one_node = False if gpus is None else np.asarray(gpus) <= gpn
    # a group of one rank has nothing to send: inside its node whatever the stride
    return ((span <= gpn) & ((gpn % np.maximum(span, 1) == 0) | one_node)) | (np.asarray(size) <= 1)


def ranks_per_node(hw, stride, size):
    """The fewest ranks any node holds of a group of `size` ranks `stride` apart (the node that sets its ring's
    pace), where stride divides gpus_per_node: gcd(size, gpus_per_node / stride), which is the group's share of a
    node where groups tile the nodes (FSDP over 64: 8) and what a split group keeps on its emptier node (tp 6 on
    8-GPU nodes: ranks 6-11 are 2 + 4, so 2; dp 12: 8 + 4, so 4).  1 where the stride does not divide a node
    (counted as one NIC: a lower bound) or reaches past it (a rank per node)."""
    s = np.maximum(np.asarray(stride), 1)
    gpn = hw.gpus_per_node
    return np.where(gpn % s == 0, np.gcd(np.asarray(size), gpn // s), 1)


def data_parallel_ranks_per_node(hw, tp, cp, pp, dp):
    """(dp group, dp x cp group) ranks a node (ranks_per_node) under the mesh order (dp, pp, cp, tp): without a
    pipeline dp x cp is one block of ranks tp apart; with one, the cp group's ranks times the dp group's."""
    dp_local = ranks_per_node(hw, np.asarray(tp) * np.asarray(cp) * np.asarray(pp), dp)
    dpcp_local = np.where(np.asarray(pp) == 1, ranks_per_node(hw, tp, np.asarray(cp) * np.asarray(dp)),
                          ranks_per_node(hw, tp, cp) * dp_local)
    return dp_local, dpcp_local


def data_parallel_tiers(hw, tp, cp, pp, dp, gpus=None):
    """(inside a node, ranks per node, one bridged pair) of a group of `dp` data-parallel ranks, then of the same ranks
    with their cp ranks (dp x cp), under the mesh order (dp, pp, cp, tp): the dp ranks tp x cp x pp apart; without a
    pipeline dp x cp is one block of ranks tp apart, with one it spans the cp group and the dp group's ranks, inside a
    node only where both are; one bridged pair (one_pair): dp x cp is cp's group where dp is 1, dp's where cp is 1.
    A hybrid-sharded plan's shard group is such a group of dp / dp_replicate ranks."""
    stride = np.asarray(tp) * np.asarray(cp) * np.asarray(pp)
    dp_in = group_inside_node(hw, stride, dp, gpus)
    dpcp_in = np.where(np.asarray(pp) == 1, group_inside_node(hw, tp, np.asarray(cp) * np.asarray(dp), gpus),
                       group_inside_node(hw, tp, cp, gpus) & dp_in)
    dp_local, dpcp_local = data_parallel_ranks_per_node(hw, tp, cp, pp, dp)
    dp_pair = one_pair(stride, dp)
    dpcp_pair = np.where(np.asarray(dp) == 1, one_pair(tp, cp), (np.asarray(cp) == 1) & dp_pair)
    return (dp_in, dp_local, dp_pair), (dpcp_in, dpcp_local, dpcp_pair)


def all_reduce(nbytes, n, bw, lat):
    """(seconds, bytes sent per rank) of a ring all-reduce; zero for a group of one."""
    n = np.asarray(n)
    frac = np.where(n > 1, 2 * (n - 1) / np.maximum(n, 1), 0.0)
    moved = frac * nbytes
    return moved / bw + np.where(n > 1, 2 * (n - 1), 0) * lat, moved


def all_gather(nbytes, n, bw, lat):
    """(seconds, bytes sent per rank) of a ring all-gather (or reduce-scatter) of a `nbytes` result."""
    n = np.asarray(n)
    frac = np.where(n > 1, (n - 1) / np.maximum(n, 1), 0.0)
    moved = frac * nbytes
    return moved / bw + np.where(n > 1, n - 1, 0) * lat, moved


reduce_scatter = all_gather


def p2p(nbytes, bw, lat):
    return nbytes / bw + lat
