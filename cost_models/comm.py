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
"""
from __future__ import annotations

import numpy as np


def tier_params(hw, inside_node, size=None):
    """(bandwidth, latency) of a group of `size` ranks: its node's fabric inside a node, the network across.
    On a full mesh (xGMI: hw.nvlink.mesh_links) a group of k ranks drives k - 1 of the links and a
    point-to-point transfer (size 2) one; a switch gives every group the full bandwidth."""
    intra = hw.nvlink.bytes_per_s
    links = hw.nvlink.mesh_links
    if links and size is not None:
        intra = intra * np.clip(np.asarray(size) - 1, 1, links) / links
    bw = np.where(inside_node, intra, hw.inter_node.bytes_per_s)
    lat = np.where(inside_node, hw.nvlink.latency_s, hw.inter_node.latency_s)
    return bw, lat


def group_inside_node(hw, stride, size, gpus=None):
    """True where every group of `size` ranks `stride` apart lies inside one node.  The groups tile the
    ranks in blocks of stride x size, so that span must divide the node's GPUs: a tensor-parallel group
    of 6 on 8-GPU nodes puts ranks 6-11 across two nodes, and the collectives wait for the slowest
    group.  A job of at most one node (`gpus`) has every group inside it."""
    span = np.asarray(stride) * np.asarray(size)
    gpn = hw.gpus_per_node
    one_node = False if gpus is None else np.asarray(gpus) <= gpn
    return (span <= gpn) & ((gpn % np.maximum(span, 1) == 0) | one_node)


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
