"""planner.topology on real `nvidia-smi topo -m` outputs, as published in public issues and pages
(tests/data/nvidia_smi: each file's `# source:` line says where; its `# kind:` / `# note:` lines what the node is and
what was left out).

Every expectation below was written by reading the matrix by eye: the GPU rows and columns, the cell of each pair (a
pair is NVLinked where its cell is NV<n>), and from those what links_said, bridged_order and unbridged_pairs should
answer.  Nothing here is recomputed with the code under test."""
from pathlib import Path

import pytest

from planner import topology

DATA = Path(__file__).parent / "data" / "nvidia_smi"


def matrix_text(name: str) -> str:
    """The fixture's text without its `# ` header lines (source, kind, note)."""
    return "".join(line for line in (DATA / name).read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("# "))


def read(name: str) -> topology.Topology:
    topo = topology.parse_topo(matrix_text(name))
    assert topo is not None, f"{name}: no GPU matrix read"
    return topo


def upper(rows: list[str]) -> dict[tuple[int, int], str]:
    """The cells above the diagonal as read off the matrix: rows[i] lists GPUi's cells to GPU(i+1), GPU(i+2), ..."""
    return {(i, i + 1 + k): cell for i, row in enumerate(rows) for k, cell in enumerate(row.split())}


def every_pair(n: int, cell: str) -> dict[tuple[int, int], str]:
    return {(a, b): cell for a in range(n) for b in range(a + 1, n)}


# name -> (GPU indices, the GPU-to-GPU cells above the diagonal, the NVLinked pairs, the pairs that are not)
MATRICES = {
    # sglang#31046: 8 x H20-3e on NVSwitch, NV18 everywhere, 8 NIC columns
    "h20_3e_8gpu_nvswitch_8nics.txt": (
        tuple(range(8)), every_pair(8, "NV18"),
        {(a, b) for a in range(8) for b in range(a + 1, 8)}, set()),
    # vllm#13855: DGX-class NV18 node, tab-separated, NIC cells fused ("NODENODE") in rows 4-7
    "h100_8gpu_nvswitch_tabs_fused_cells.txt": (
        tuple(range(8)), every_pair(8, "NV18"),
        {(a, b) for a in range(8) for b in range(a + 1, 8)}, set()),
    # nccl#1617: 4 x H100, NV6 between every pair
    "h100_4gpu_nv6_4nics.txt": (
        (0, 1, 2, 3), every_pair(4, "NV6"),
        {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}, set()),
    # vllm#19607: two GPUs, NV12, empty affinity cells
    "a100_2gpu_nv12_blank_affinity.txt": (
        (0, 1), {(0, 1): "NV12"}, {(0, 1)}, set()),
    # nccl-tests#178: 8 A100 PCIe cards bridged 0-1, 2-3, 4-5, 6-7
    "a100_pcie_8gpu_bridged_pairs.txt": (
        tuple(range(8)),
        upper(["NV12 NODE NODE SYS SYS SYS SYS",
               "NODE NODE SYS SYS SYS SYS",
               "NV12 SYS SYS SYS SYS",
               "SYS SYS SYS SYS",
               "NV12 NODE NODE",
               "NODE NODE",
               "NV12"]),
        {(0, 1), (2, 3), (4, 5), (6, 7)},
        {(0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7),
         (2, 4), (2, 5), (2, 6), (2, 7), (3, 4), (3, 5), (3, 6), (3, 7), (4, 6), (4, 7), (5, 6), (5, 7)}),
    # k8s-device-plugin#436: four A100, the matrix shows one bridge (0-1); 2-3 is NODE
    "a100_4gpu_one_bridge_mlx5_tabs.txt": (
        (0, 1, 2, 3),
        upper(["NV12 SYS SYS",
               "SYS SYS",
               "NODE"]),
        {(0, 1)}, {(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}),
    # siboehm/bench: three RTX A6000, 0-1 bridged (NV4), GPU2 on PCIe
    "rtx_a6000_3gpu_one_bridge_tabs.txt": (
        (0, 1, 2),
        upper(["NV4 NODE",
               "NODE"]),
        {(0, 1)}, {(0, 2), (1, 2)}),
    # ucx-py docs: DGX-1, hybrid cube-mesh
    "v100_dgx1_hybrid_cube_mesh.txt": (
        tuple(range(8)),
        upper(["NV1 NV1 NV2 NV2 SYS SYS SYS",
               "NV2 NV1 SYS NV2 SYS SYS",
               "NV2 SYS SYS NV1 SYS",
               "SYS SYS SYS NV1",
               "NV1 NV1 NV2",
               "NV2 NV1",
               "NV2"]),
        {(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7),
         (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)},
        {(0, 5), (0, 6), (0, 7), (1, 4), (1, 6), (1, 7), (2, 4), (2, 5), (2, 7), (3, 4), (3, 5), (3, 6)}),
    # go-gpuallocator#17: 8 x RTX 4090, SYS between every pair
    "rtx4090_8gpu_pcie_sys_tabs.txt": (
        tuple(range(8)), every_pair(8, "SYS"),
        set(), {(a, b) for a in range(8) for b in range(a + 1, 8)}),
    # club-3090#46: five GPUs, PHB / NODE / SYS
    "pcie_5gpu_phb_node_sys.txt": (
        (0, 1, 2, 3, 4),
        upper(["SYS SYS SYS SYS",
               "PHB NODE NODE",
               "NODE NODE",
               "PHB"]),
        set(), {(a, b) for a in range(5) for b in range(a + 1, 5)}),
}

# name -> links_said(topo, every GPU): (kind, words)
SAID = {
    "h20_3e_8gpu_nvswitch_8nics.txt": ("all", "NVLink between every pair (NV18)"),
    "h100_8gpu_nvswitch_tabs_fused_cells.txt": ("all", "NVLink between every pair (NV18)"),
    "h100_4gpu_nv6_4nics.txt": ("all", "NVLink between every pair (NV6)"),
    "a100_2gpu_nv12_blank_affinity.txt": ("all", "NVLink between every pair (NV12)"),
    "a100_pcie_8gpu_bridged_pairs.txt": ("pairs", "NVLink between 0-1 (NV12), 2-3 (NV12), 4-5 (NV12), 6-7 (NV12) only"),
    "a100_4gpu_one_bridge_mlx5_tabs.txt": ("pairs", "NVLink between 0-1 (NV12) only"),
    "rtx_a6000_3gpu_one_bridge_tabs.txt": ("pairs", "NVLink between 0-1 (NV4) only"),
    "v100_dgx1_hybrid_cube_mesh.txt": (
        "pairs", "NVLink between 0-1 (NV1), 0-2 (NV1), 0-3 (NV2), 0-4 (NV2), 1-2 (NV2), 1-3 (NV1), 1-5 (NV2), "
                 "2-3 (NV2), 2-6 (NV1), 3-7 (NV1), 4-5 (NV1), 4-6 (NV1), 4-7 (NV2), 5-6 (NV2), 5-7 (NV1), 6-7 (NV2) "
                 "only"),
    "rtx4090_8gpu_pcie_sys_tabs.txt": ("none", "no NVLink between them (PCIe)"),
    "pcie_5gpu_phb_node_sys.txt": ("none", "no NVLink between them (PCIe)"),
}

# name -> [(gpus, n, bridged_order's answer)]: the first order, in the GPUs' own order, whose pairs (0, 1), (2, 3),
# ... are NVLinked, or None where the GPUs cannot be so paired
ORDERS = {
    "h20_3e_8gpu_nvswitch_8nics.txt": [(list(range(8)), 8, list(range(8))), (list(range(8)), 2, [0, 1]),
                                       ([3, 5, 7], 3, [3, 5, 7])],
    "h100_8gpu_nvswitch_tabs_fused_cells.txt": [(list(range(8)), 8, list(range(8))), ([7, 0], 2, [7, 0])],
    "h100_4gpu_nv6_4nics.txt": [([0, 1, 2, 3], 4, [0, 1, 2, 3]), ([2, 0], 2, [2, 0])],
    "a100_2gpu_nv12_blank_affinity.txt": [([0, 1], 2, [0, 1])],
    "a100_pcie_8gpu_bridged_pairs.txt": [(list(range(8)), 8, list(range(8))), ([0, 2, 1, 3], 4, [0, 1, 2, 3]),
                                         ([0, 2, 4, 6], 4, None), (list(range(8)), 5, [0, 1, 2, 3, 4]),
                                         ([1, 6, 7, 0], 4, [1, 0, 6, 7])],
    "a100_4gpu_one_bridge_mlx5_tabs.txt": [([0, 1, 2, 3], 4, None), ([0, 1, 2, 3], 2, [0, 1]), ([2, 3], 2, None),
                                           ([0, 1, 2, 3], 3, [0, 1, 2])],
    "rtx_a6000_3gpu_one_bridge_tabs.txt": [([0, 1, 2], 3, [0, 1, 2]), ([0, 1, 2], 2, [0, 1]), ([1, 2], 2, None),
                                           ([2, 0, 1], 3, [0, 1, 2])],
    "v100_dgx1_hybrid_cube_mesh.txt": [(list(range(8)), 8, list(range(8))), ([0, 5, 6, 7], 4, None),
                                       ([0, 5, 6, 7], 3, [5, 6, 0]), ([4, 1, 2, 7], 4, [4, 7, 1, 2]),
                                       ([3, 4], 2, None), ([3, 7], 2, [3, 7])],
    "rtx4090_8gpu_pcie_sys_tabs.txt": [(list(range(8)), 2, None), (list(range(8)), 8, None)],
    "pcie_5gpu_phb_node_sys.txt": [([0, 1, 2, 3, 4], 4, None), ([1, 2], 2, None)],
}

# name -> [(devices, unbridged_pairs' answer)]; the first entry is the identity order (CUDA devices 0, 1, ...)
UNBRIDGED = {
    "h20_3e_8gpu_nvswitch_8nics.txt": [(list(range(8)), [])],
    "h100_8gpu_nvswitch_tabs_fused_cells.txt": [(list(range(8)), [])],
    "h100_4gpu_nv6_4nics.txt": [([0, 1, 2, 3], [])],
    "a100_2gpu_nv12_blank_affinity.txt": [([0, 1], [])],
    "a100_pcie_8gpu_bridged_pairs.txt": [(list(range(8)), []), ([0, 2, 1, 3], [(0, 2), (1, 3)]),
                                         ([1, 0, 7, 6, 3], [])],
    "a100_4gpu_one_bridge_mlx5_tabs.txt": [([0, 1, 2, 3], [(2, 3)]), ([0, 2, 1, 3], [(0, 2), (1, 3)])],
    "rtx_a6000_3gpu_one_bridge_tabs.txt": [([0, 1, 2], []), ([1, 2, 0], [(1, 2)])],
    "v100_dgx1_hybrid_cube_mesh.txt": [(list(range(8)), []), ([3, 4, 0, 5], [(3, 4), (0, 5)]),
                                       ([0, 4, 1, 5, 2, 6, 3, 7], [])],
    "rtx4090_8gpu_pcie_sys_tabs.txt": [(list(range(8)), [(0, 1), (2, 3), (4, 5), (6, 7)])],
    "pcie_5gpu_phb_node_sys.txt": [([0, 1, 2, 3, 4], [(0, 1), (2, 3)])],
}


def test_every_fixture_is_covered_and_names_its_source():
    names = sorted(p.name for p in DATA.glob("*.txt"))
    assert names == sorted(MATRICES) == sorted(SAID) == sorted(ORDERS) == sorted(UNBRIDGED)
    for name in names:
        first = (DATA / name).read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# source: https://"), name


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_the_gpus_and_their_cells_are_read_as_printed(name):
    gpus, cells, _, _ = MATRICES[name]
    topo = read(name)
    assert topo.gpus == gpus
    assert topo.links == cells  # the GPU-to-GPU cells only: no NIC or affinity column read as a GPU's
    for (a, b), cell in cells.items():
        assert topo.link(b, a) == cell


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_the_nvlinked_pairs_are_the_nv_cells(name):
    gpus, _, linked, unlinked = MATRICES[name]
    topo = read(name)
    pairs = {(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]}
    assert linked | unlinked == pairs and not linked & unlinked  # the expectation covers every pair once
    assert {p for p in pairs if topo.nvlinked(*p)} == linked
    assert {p for p in pairs if not topo.nvlinked(*p)} == unlinked
    assert all(topo.nvlinked(b, a) for a, b in linked)


@pytest.mark.parametrize("name", sorted(SAID))
def test_links_said(name):
    topo = read(name)
    assert topology.links_said(topo, list(topo.gpus)) == SAID[name]


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_bridged_order(name):
    topo = read(name)
    for gpus, n, order in ORDERS[name]:
        assert topology.bridged_order(topo, gpus, n) == order, (gpus, n)


@pytest.mark.parametrize("name", sorted(UNBRIDGED))
def test_unbridged_pairs(name):
    topo = read(name)
    assert UNBRIDGED[name][0][0] == list(topo.gpus)  # the identity order comes first
    for devices, pairs in UNBRIDGED[name]:
        assert topology.unbridged_pairs(topo, devices) == pairs, devices


def test_a_subset_of_the_dgx1_is_said_as_it_is():
    """links_said on a few of the DGX-1's GPUs: 0-1-2-3 is a fully NVLinked quad, 0 with 5-6-7 is not."""
    topo = read("v100_dgx1_hybrid_cube_mesh.txt")
    assert topology.links_said(topo, [0, 1, 2, 3]) == ("all", "NVLink between every pair (NV1, NV2)")
    assert topology.links_said(topo, [0, 5]) == ("none", "no NVLink between them (PCIe)")
    assert topology.links_said(topo, [0, 5, 6, 7]) == ("pairs", "NVLink between 5-6 (NV2), 5-7 (NV1), 6-7 (NV2) only")
    assert topology.links_said(topo, [3]) == ("none", "one GPU")


def test_the_visible_devices_map_onto_a_real_matrix():
    topo = read("a100_pcie_8gpu_bridged_pairs.txt")
    assert topology.visible_gpus(topo, {"CUDA_VISIBLE_DEVICES": "6,7,4,5"}) == ([6, 7, 4, 5], "")
    devices, _ = topology.visible_gpus(topo, {"CUDA_VISIBLE_DEVICES": "1,2"})
    assert topology.unbridged_pairs(topo, devices) == [(1, 2)]


# --- detect_node on the nodes whose GPUs the source names (or whose kind it makes plain) ---

def _gpus(n, name, mib=0):
    """nvidia-smi's GPU list for the node; memory is not in these sources and not what is tested (0)."""
    return [(i, name, mib) for i in range(n)]


def test_detect_the_h20_3e_nvswitch_node():
    """sglang#31046 names its GPUs "NVIDIA H20-3e": its own profile, h20-3e-141gb (until it had one, the default base,
    said so); every pair NVLinked (NV18), eight GPUs as the profile's node: no other flag or note."""
    found = topology.detect_node(_gpus(8, "NVIDIA H20-3e"), read("h20_3e_8gpu_nvswitch_8nics.txt"), [])
    assert found["profile"] == "h20-3e-141gb" and found["profile_matched"]
    assert (found["links"], found["links_said"]) == ("all", "NVLink between every pair (NV18)")
    assert found["recommend_flags"] == ["--hardware h20-3e-141gb"] and found["notes"] == []


def test_detect_a_bridged_a100_pcie_node():
    """nccl-tests#178 (8 A100 bridged in pairs) and k8s-device-plugin#436 (4 A100, one bridge in the matrix). A100s
    bridged by NVLink are the PCIe card; the name here is nvidia-smi's for the 80 GB one (an assumption: the sources
    do not print it; the 40 GB card's "NVIDIA A100-PCIE-40GB" maps to the same profile)."""
    name = "NVIDIA A100 80GB PCIe"
    paired = topology.detect_node(_gpus(8, name), read("a100_pcie_8gpu_bridged_pairs.txt"), [])
    assert paired["profile"] == "a100-pcie-80gb" and paired["profile_matched"]
    assert paired["links"] == "pairs" and paired["recommend_flags"] == ["--hardware a100-pcie-80gb"]
    assert paired["notes"] == []  # the bridged pairs are GPUs (0, 1), (2, 3), ...: nothing to reorder
    one = topology.detect_node(_gpus(4, name), read("a100_4gpu_one_bridge_mlx5_tabs.txt"), [])
    assert one["links"] == "pairs" and one["recommend_flags"] == ["--hardware a100-pcie-80gb"]
    assert len(one["notes"]) == 1
    assert one["notes"][0].startswith("not every GPU here has a bridged partner (NVLink between 0-1 (NV12) only)")


def test_detect_bridged_or_pcie_cards_against_the_default_base():
    """siboehm/bench's three RTX A6000 (0-1 bridged) and go-gpuallocator#17's eight RTX 4090 (PCIe only): no shipped
    profile; the default base joins every GPU by NVLink and these nodes do not, which detect says."""
    a6000 = topology.detect_node(_gpus(3, "NVIDIA RTX A6000"), read("rtx_a6000_3gpu_one_bridge_tabs.txt"), [])
    assert a6000["profile"] == "h100-sxm-80gb" and not a6000["profile_matched"] and a6000["links"] == "pairs"
    assert a6000["recommend_flags"] == ["--hardware h100-sxm-80gb", "--gpus-per-node 3"]
    assert any("joins every GPU by NVLink" in n and "(NVLink between 0-1 (NV4) only)" in n for n in a6000["notes"])
    rtx = topology.detect_node(_gpus(8, "NVIDIA GeForce RTX 4090"), read("rtx4090_8gpu_pcie_sys_tabs.txt"), [])
    assert rtx["links"] == "none" and rtx["recommend_flags"] == ["--hardware h100-sxm-80gb"]
    assert any("joins every GPU by NVLink" in n and "(no NVLink between them (PCIe))" in n for n in rtx["notes"])


def test_a_gpu_row_whose_cells_ran_together_is_read_from_the_other_rows():
    """A copied matrix whose GPU cells ran together (as vllm#13855's NIC cells did: "NODENODE") would shift that
    row's cells onto the wrong GPUs: the row's own cell is then not its X, so parse_topo skips the row and reads each
    of its pairs from the other GPU's row."""
    lines = matrix_text("a100_pcie_8gpu_bridged_pairs.txt").splitlines()
    row2 = next(i for i, line in enumerate(lines) if line.startswith("GPU2"))
    fused = lines[row2].replace("NODE    NODE", "NODENODE", 1)  # GPU2's cells to GPU0 and GPU1 run together
    assert fused != lines[row2]
    topo = topology.parse_topo("\n".join(lines[:row2] + [fused] + lines[row2 + 1:]))
    gpus, cells, linked, _ = MATRICES["a100_pcie_8gpu_bridged_pairs.txt"]
    assert topo.gpus == gpus and topo.links == cells  # (read as it stood, GPU2 - GPU3 would have been "X")
    assert topology.bridged_order(topo, list(gpus), 8) == list(gpus)
