"""The device mesh and the one dataclass that is the truth about a rank's place in it.

Mesh dims are ("dp", "pp", "tp") -- plus "cp" between pp and tp when cp > 1; under ZeRO-3's hybrid sharding
("dp_replicate", "dp_shard", "pp", ["cp",] "tp"), the first two flattened into "dp" -- with TP
innermost so a TP group is made of consecutive ranks and stays inside a node, and a CP group
next (ranks tp apart).  Context-parallel ranks hold replicated parameters, so gradients are
averaged over dp x cp: ``dp_cp_group`` is the flattened ("dp", "cp") group (the dp group when
cp = 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    pp: int
    cp: int
    tp: int
    dp_replicate: int = 1  # ZeRO-3's hybrid sharding: dp as (dp_replicate, dp / dp_replicate), the shard dim inner

    @classmethod
    def from_plan(cls, plan) -> "ParallelDims":
        p = plan.parallel
        return cls(dp=p.dp, pp=p.pp, cp=p.cp, tp=p.tp, dp_replicate=p.dp_replicate)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def check(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise ValueError(f"dp({self.dp}) * pp({self.pp}) * cp({self.cp}) * tp({self.tp}) = {self.world_size} "
                             f"!= WORLD_SIZE({world_size}); launch with --nproc-per-node x --nnodes = {self.world_size}")


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """init_device_mesh over (dp, pp, [cp,] tp), TP innermost."""
    dims.check(dist.get_world_size())
    if dims.dp_replicate > 1:  # hybrid sharding: FSDP2's 2D mesh, its dims flattened back into "dp"
        cp = (dims.cp,) if dims.cp > 1 else ()
        mesh = init_device_mesh(device_type, (dims.dp_replicate, dims.dp // dims.dp_replicate, dims.pp, *cp, dims.tp),
                                mesh_dim_names=("dp_replicate", "dp_shard", "pp", *("cp",) * len(cp), "tp"))
        mesh["dp_replicate", "dp_shard"]._flatten("dp")
        return mesh
    if dims.cp > 1:
        shape, names = (dims.dp, dims.pp, dims.cp, dims.tp), ("dp", "pp", "cp", "tp")
    else:
        shape, names = (dims.dp, dims.pp, dims.tp), ("dp", "pp", "tp")
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


@dataclass(frozen=True)
class RankCoords:
    """Where this rank sits, and the groups it talks over."""

    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_group: object
    pp_group: object
    tp_group: object
    cp_rank: int = 0
    cp_group: object = None  # None when cp = 1 (a group of one everywhere in mappings.py)
    dp_cp_group: object = None  # gradient averaging group: dp x cp

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh) -> "RankCoords":
        cp = "cp" in (mesh.mesh_dim_names or ())
        dp_group = mesh["dp"].get_group()
        return cls(dp_rank=mesh["dp"].get_local_rank(), pp_rank=mesh["pp"].get_local_rank(),
                   tp_rank=mesh["tp"].get_local_rank(), dp_group=dp_group,
                   pp_group=mesh["pp"].get_group(), tp_group=mesh["tp"].get_group(),
                   cp_rank=mesh["cp"].get_local_rank() if cp else 0,
                   cp_group=mesh["cp"].get_group() if cp else None,
                   dp_cp_group=_dp_cp(mesh).get_group() if cp else dp_group)


def _dp_cp(mesh: DeviceMesh) -> DeviceMesh:
    """The flattened dp x cp mesh (a cp rank's gradient-averaging group), from the root's own dims: under hybrid
    sharding dp is itself flattened, and torch deprecates slicing a flattened dim from the root."""
    dp = ("dp_replicate", "dp_shard") if "dp_replicate" in mesh.mesh_dim_names else ("dp",)
    return mesh[(*dp, "cp")]._flatten("dp_cp")


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: dp, or under hybrid sharding the 2D (dp_replicate, dp_shard) mesh, over which
    fully_shard shards on the inner dim and replicates on the outer (HSDP: reduce-scatter, then all-reduce)."""
    if "dp_replicate" in (mesh.mesh_dim_names or ()):
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp"]


def embedding_group(mesh: DeviceMesh):
    """The group of this rank's pipeline ends (pp ranks 0 and pp-1 of its pipeline), whose tied embedding
    and head copy sum their gradients: Megatron's embedding group.  Every rank creates every pipeline's
    group, in one order (dist.new_group is collective); returns None for a rank at neither end."""
    names = list(mesh.mesh_dim_names)
    ranks = mesh.mesh.movedim(names.index("pp"), -1).reshape(-1, mesh.mesh.shape[names.index("pp")])
    me, mine = dist.get_rank(), None
    for row in ranks.tolist():
        ends = sorted({row[0], row[-1]})
        group = dist.new_group(ends)
        if me in ends:
            mine = group
    return mine


def expert_groups(mesh: DeviceMesh, ep: int) -> tuple:
    """A mixture of experts' (expert-parallel group, expert-data-parallel group) of this rank (None for a group of
    one): each pipeline stage's tp x cp x dp ranks, in (dp, cp, tp) order with tp innermost, cut into groups of ep
    consecutive ranks holding the E experts between them (Megatron-Core's parallel folding, expert tensor parallelism
    1: an ep within a node where tp x cp x ep fits it), and the tp x cp x dp / ep ranks holding the same experts, ep
    apart, whose expert gradients are summed.  Every rank creates every group in one order (dist.new_group is
    collective)."""
    names = list(mesh.mesh_dim_names)
    stages = mesh.mesh.movedim(names.index("pp"), 0)
    me, mine = dist.get_rank(), {"ep": None, "edp": None}
    for row in stages.reshape(stages.shape[0], -1).tolist():
        if len(row) % ep:
            raise ValueError(f"ep={ep} does not divide a stage's {len(row)} tp x cp x dp ranks")
        for kind, groups in (("ep", [row[i:i + ep] for i in range(0, len(row), ep)]),
                             ("edp", [row[j::ep] for j in range(ep)])):
            for members in groups:
                if len(members) == 1:
                    continue
                group = dist.new_group(members)
                if me in members:
                    mine[kind] = group
    return mine["ep"], mine["edp"]


def expert_data_parallel_mesh(mesh: DeviceMesh, ep: int, replicate: int = 1) -> DeviceMesh:
    """ZeRO-3 with a mixture of experts: the 1-D mesh of this rank's expert-data-parallel group (expert_groups' edp
    members, a mesh of one where no other rank holds its experts), which FSDP2 shards the experts over: torchtitan's
    ``edp_mesh`` ("efsdp", torchtitan/models/llama4/infra/parallelize.py apply_fsdp).  A (pp, edp, ep) DeviceMesh over
    the same ranks, built collectively (every rank, one order).  Under hybrid sharding (replicate = dp_replicate > 1)
    the 2-D (edp_replicate, edp_shard) mesh: the group's members in order, its first edp / replicate the ranks of dp
    replica group 0 (the stage's ranks run (dp_replicate, dp_shard, cp, tp) outermost first), so FSDP2 shards the
    experts over a replica group's share and all-reduces each shard across the replicas, as torchtitan's HSDP mesh
    (dp_replicate, dp_shard_mod_ep) does."""
    names = list(mesh.mesh_dim_names)
    stages = mesh.mesh.movedim(names.index("pp"), 0)
    rows = stages.reshape(stages.shape[0], -1)
    if rows.shape[1] % ep:
        raise ValueError(f"ep={ep} does not divide a stage's {rows.shape[1]} tp x cp x dp ranks")
    # rows[s][i * ep + j]: column j of (edp, ep) is row[j::ep], the ranks holding expert-parallel rank j's experts
    layout = rows.reshape(rows.shape[0], -1, ep)
    if replicate > 1:
        if layout.shape[1] % replicate:
            raise ValueError(f"dp_replicate={replicate} does not divide the experts' {layout.shape[1]} data-parallel "
                             "ranks")
        layout = layout.reshape(layout.shape[0], replicate, -1, ep)
        return DeviceMesh(mesh.device_type, layout, mesh_dim_names=("pp", "edp_replicate", "edp_shard", "ep"))[
            "edp_replicate", "edp_shard"]
    return DeviceMesh(mesh.device_type, layout, mesh_dim_names=("pp", "edp", "ep"))["edp"]
