"""Which GPUs NVLink joins (`nvidia-smi topo -m`, planner.topology), and what launch and calibrate make of it on a
node whose cards are bridged in pairs (the H100 PCIe's and A100 PCIe's profiles)."""
import pytest

import hardware_profiles
from planner import launch, topology
from planner.core import recommend
from planner.schema import HardwareProfile
from planner.search import Pins

# an 8-card PCIe server as nvidia-smi prints it on a terminal (the header underlined), its bridges fitted across
# the first four cards' slots (0-2, 1-3) and along the last four's (4-5, 6-7), two NIC columns
ROWS = [["X", "PHB", "NV12", "SYS", "SYS", "SYS", "SYS", "SYS"],
        ["PHB", "X", "SYS", "NV12", "SYS", "SYS", "SYS", "SYS"],
        ["NV12", "SYS", "X", "PHB", "SYS", "SYS", "SYS", "SYS"],
        ["SYS", "NV12", "PHB", "X", "SYS", "SYS", "SYS", "SYS"],
        ["SYS", "SYS", "SYS", "SYS", "X", "NV12", "PHB", "PHB"],
        ["SYS", "SYS", "SYS", "SYS", "NV12", "X", "PHB", "PHB"],
        ["SYS", "SYS", "SYS", "SYS", "PHB", "PHB", "X", "NV12"],
        ["SYS", "SYS", "SYS", "SYS", "PHB", "PHB", "NV12", "X"]]
CROSSED = ("\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\t"
           "GPU NUMA ID\x1b[0m\n" + "".join(
               f"GPU{i}\t" + "\t".join(f" {c} " if c == "X" else c for c in row)
               + f"\tPIX\tSYS\t{'0-47' if i < 4 else '48-95'}\t{i // 4}\t\tN/A\n" for i, row in enumerate(ROWS))
           + "NIC0\tPIX\tPIX\tPIX\tPIX\tSYS\tSYS\tSYS\tSYS\t X \tSYS\n\nLegend:\n\n  X    = Self\n"
           "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
           "  NV#  = Connection traversing a bonded set of # NVLinks\n")
NO_NVLINK = CROSSED.replace("NV12", "PIX")


def test_the_matrix_is_read_as_nvidia_smi_prints_it():
    topo = topology.parse_topo(CROSSED)
    assert topo.gpus == tuple(range(8))
    assert {k for k, v in topo.links.items() if v.startswith("NV")} == {(0, 2), (1, 3), (4, 5), (6, 7)}
    assert topo.link(1, 0) == "PHB" and topo.link(7, 0) == "SYS" and topo.nvlinked(2, 0) and not topo.nvlinked(0, 1)
    # one GPU (its affinity columns right after the diagonal), and text without a matrix
    one = topology.parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-63\t0\n")
    assert one.gpus == (0,) and one.links == {}
    for text in ("", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"):
        assert topology.parse_topo(text) is None


def test_devices_follow_cuda_visible_devices():
    topo = topology.parse_topo(CROSSED)
    assert topology.visible_gpus(topo, {}) == (list(range(8)), "")
    assert topology.visible_gpus(topo, {"CUDA_VISIBLE_DEVICES": "3, 1,9,0"}) == ([3, 1], "")  # CUDA stops at 9
    devices, why = topology.visible_gpus(topo, {"CUDA_VISIBLE_DEVICES": "GPU-8f6c"})
    assert devices is None and "other than by index" in why
    assert topology.unbridged_pairs(topo, list(range(8))) == [(0, 1), (2, 3)]
    assert topology.unbridged_pairs(topo, [0, 2, 1, 3, 4, 5, 6, 7, 3]) == []  # a ninth rank has no pair


def test_an_order_of_bridged_pairs_is_found_where_one_exists():
    topo = topology.parse_topo(CROSSED)
    assert topology.bridged_order(topo, list(range(8)), 8) == [0, 2, 1, 3, 4, 5, 6, 7]
    assert topology.bridged_order(topo, list(range(8)), 4) == [0, 2, 1, 3]
    assert topology.bridged_order(topo, [0, 1, 4, 5], 3) == [4, 5, 0]  # the odd rank takes a GPU left over
    assert topology.bridged_order(topo, [0, 1, 2, 5], 4) is None  # 0-2 pairs, 1 and 5 do not
    assert topology.bridged_order(topology.parse_topo(NO_NVLINK), list(range(8)), 2) is None


@pytest.fixture(scope="module")
def tp2_plan():
    """llama3-8b on 8 H100 PCIe at tp 2: its tensor-parallel pairs priced at the bridges."""
    return recommend("llama3-8b", gpus=8, hardware="h100-pcie-80gb", suggest=False,
                     pins=Pins(tp=2, pp=1, cp=1, mbs=1, zero=1, recompute="none", offload="none"))


def test_launch_warns_where_a_pair_of_ranks_is_not_bridged(tp2_plan):
    bare = launch.step_without_bridges(tp2_plan)
    step = tp2_plan.prediction.step_time_s
    assert bare > step * 1.01  # the tensor-parallel collectives at 40 GB/s rather than the bridge's 116
    # the plan itself says so (recommend and evaluate), with the same step
    said = [w for w in tp2_plan.prediction.warnings if w.startswith("NVLink bridges:")]
    assert len(said) == 1 and f"{bare:.4g} s a step over PCIe alone" in said[0] and "(116 GB/s)" in said[0]
    from planner.core import evaluate_plan
    assert evaluate_plan(tp2_plan).prediction.warnings == tp2_plan.prediction.warnings
    topo = topology.parse_topo(CROSSED)
    warn = launch.check_bridges(tp2_plan, "cuda", 8, lambda: (topo, ""), {})
    assert warn.ok and warn.line().startswith("[warn] bridges:")
    assert "GPU0-GPU1 (PHB), GPU2-GPU3 (PHB) not NVLinked" in warn.detail and f"{bare:.4g} s" in warn.detail
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,2,1,3,4,5,6,7" in warn.detail
    ok = launch.check_bridges(tp2_plan, "cuda", 8, lambda: (topo, ""), {"CUDA_VISIBLE_DEVICES": "0,2,1,3,4,5,6,7"})
    assert ok.line().startswith("[ok  ] bridges:") and "0-2 (NV12), 1-3 (NV12)" in ok.detail
    # a node without bridges: nothing to reorder, the profile is the wrong one
    none = launch.check_bridges(tp2_plan, "cuda", 8, lambda: (topology.parse_topo(NO_NVLINK), ""), {})
    assert "without nvlink.bridge_gbytes_per_s" in none.detail and "CUDA_VISIBLE_DEVICES=" not in none.detail
    # unchecked, said so, where nvidia-smi cannot tell
    unsure = launch.check_bridges(tp2_plan, "cuda", 8, lambda: (None, "nvidia-smi is not on PATH"), {})
    assert unsure.line().startswith("[--  ] bridges:") and "nvidia-smi is not on PATH" in unsure.detail
    assert launch.check_bridges(tp2_plan, "cpu", 8, lambda: (topo, ""), {}) is None
    # NCCL told not to use peer-to-peer: the bridges idle whatever the cards
    off = launch.check_bridges(tp2_plan, "cuda", 8, lambda: (topo, ""), {"NCCL_P2P_DISABLE": "1",
                                                                         "CUDA_VISIBLE_DEVICES": "0,2,1,3,4,5,6,7"})
    assert off.line().startswith("[warn] bridges:") and "peer-to-peer transport off" in off.detail


def test_no_bridge_check_where_the_plan_prices_no_pair(tp2_plan):
    dp8 = recommend("llama3-8b", gpus=8, hardware="h100-pcie-80gb", suggest=False,
                    pins=Pins(tp=1, pp=1, cp=1, mbs=1, zero=2, recompute="none", offload="none"))
    assert launch.step_without_bridges(dp8) is None  # eight data-parallel ranks: one PCIe group
    assert not any(w.startswith("NVLink bridges:") for w in dp8.prediction.warnings)
    assert launch.check_bridges(dp8, "cuda", 8, lambda: pytest.fail("read the topology"), {}) is None
    sxm = recommend("llama3-8b", gpus=8, hardware="h100-sxm-80gb", suggest=False, pins=Pins(tp=2, pp=1, cp=1))
    assert launch.step_without_bridges(sxm) is None  # an NVSwitch node: no bridges in the profile


def _coll(busbw):
    return [{"op": op, "bytes": b, "s": b / 1e11, "busbw_gbytes_per_s": busbw if b > 1e6 else 1.0}
            for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv") for b in (8 << 10, 256 << 20)]


def test_calibrate_reads_the_bridges_it_measured():
    from planner.calibrate import apply_collectives
    pcie = hardware_profiles.load_profile("h100-pcie-80gb")
    crossed = topology.parse_topo(CROSSED)
    # two bridged GPUs measure the bridge; two that are not measure PCIe (40 GB/s: 0.625 of 64), the bridges kept
    for env, field, value, kept in (({"CUDA_VISIBLE_DEVICES": "0,2"}, "bridge_efficiency", 0.4, ("efficiency", 0.625)),
                                    ({}, "efficiency", 0.625, ("bridge_efficiency", 0.387))):
        data, fields = pcie.model_dump(mode="json"), []
        busbw = 120.0 if field == "bridge_efficiency" else 40.0
        note = apply_collectives(data, _coll(busbw), pcie, 2, fields, crossed, env)
        nv = HardwareProfile(**data).nvlink.model_dump()
        assert nv[field] == pytest.approx(value) and nv[kept[0]] == kept[1] and f"nvlink.{field}" in fields
        assert ("not NVLinked (PHB" in note) == (field == "efficiency")
    # eight GPUs measure the node's PCIe rate, and their first two, where bridged, the bridge apart
    from planner.calibrate import bridged_first_pair
    assert not bridged_first_pair(crossed, {}) and bridged_first_pair(crossed, {"CUDA_VISIBLE_DEVICES": "0,2,1,3"})
    data, fields = pcie.model_dump(mode="json"), []
    note = apply_collectives(data, _coll(40.0), pcie, 8, fields, crossed, {"CUDA_VISIBLE_DEVICES": "0,2,1,3,4,5,6,7"},
                             pair_rows=_coll(150.0))
    nv = HardwareProfile(**data).nvlink
    assert (nv.efficiency, nv.bridge_efficiency) == (0.625, 0.5) and {"nvlink.efficiency", "nvlink.bridge_efficiency"} \
        <= set(fields)
    assert "a bridged pair apart (CUDA devices 0 and 1): all-reduce busbw 150 GB/s / bridge 300 GB/s" in note
    # a node with no NVLink at all: the base's bridges are not this node's
    data = pcie.model_dump(mode="json")
    note = apply_collectives(data, _coll(40.0), pcie, 8, [], topology.parse_topo(NO_NVLINK), {})
    prof = HardwareProfile(**data)
    assert prof.nvlink.bridge_gbytes_per_s is None and prof.nvlink.efficiency == pytest.approx(0.625)
    assert "bridged pairs dropped" in note


def _sysfs(root, ib=(), eth=()):
    """A fake /sys: RDMA ports (device, port, rate text, state, link layer) and network interfaces (name, operstate,
    speed, physical)."""
    for dev, port, rate, state, layer in ib:
        here = root / "class" / "infiniband" / dev / "ports" / str(port)
        here.mkdir(parents=True)
        for name, text in (("rate", rate), ("state", state), ("link_layer", layer)):
            (here / name).write_text(text + "\n")
    for name, oper, speed, physical in eth:
        here = root / "class" / "net" / name
        here.mkdir(parents=True)
        (here / "operstate").write_text(oper + "\n")
        (here / "speed").write_text(f"{speed}\n")
        if physical:
            (here / "device").mkdir()
    return str(root)


def test_the_node_network_is_read_from_sysfs(tmp_path):
    ndr = [(f"mlx5_{i}", 1, "400 Gb/sec (4X NDR)", "4: ACTIVE", "InfiniBand") for i in range(8)]
    root = _sysfs(tmp_path / "a", ib=ndr + [("mlx5_8", 1, "400 Gb/sec (4X NDR)", "1: DOWN", "InfiniBand"),
                                            ("mlx5_9", 1, "100 Gb/sec (4X EDR)", "4: ACTIVE", "Ethernet")],
                  eth=[("eth0", "up", 100000, True)])
    ports = topology.node_network(root, {})
    assert len(ports) == 9 and sum(p.gbits for p in ports) == 3300  # the DOWN port left out, Ethernet not read
    assert topology.describe_ports(ports) == "8 x 400 Gb/s InfiniBand + 1 x 100 Gb/s Ethernet"
    # no RDMA device: the physical interfaces that are up, at a known speed
    root = _sysfs(tmp_path / "b", eth=[("eth0", "up", 100000, True), ("eth1", "up", -1, True), ("lo", "unknown", 0,
                                       False), ("docker0", "up", 10000, False), ("eth2", "down", 25000, True)])
    assert topology.node_network(root, {}) == [topology.NetPort("eth0", 100.0, "TCP")]
    assert topology.node_network(str(tmp_path / "none"), {}) == []
    # NCCL's own selection: NCCL_IB_HCA's devices and ports (a node's storage NICs left out), NCCL_IB_DISABLE, and
    # NCCL_SOCKET_IFNAME for the sockets
    root = str(tmp_path / "a")
    ib = lambda spec: sorted(p.name for p in topology.node_network(root, {"NCCL_IB_HCA": spec}))  # noqa: E731
    assert ib("=mlx5_0:1,mlx5_1") == ["mlx5_0/1", "mlx5_1/1"]
    assert len(ib("^=mlx5_9")) == 8 and ib("^mlx5") == ["eth0"]  # nothing left over RDMA: the sockets
    assert ib("mlx5_1") == ["mlx5_1/1"] and ib("=mlx5_0:2") == ["eth0"]
    assert [p.name for p in topology.node_network(root, {"NCCL_IB_DISABLE": "1"})] == ["eth0"]
    assert topology.node_network(root, {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^=eth0"}) == []


@pytest.fixture(scope="module")
def two_node_plan():
    """llama3-70b on 16 H100 SXM: its data-parallel traffic crosses the two nodes at 50 GB/s a GPU (400 Gb/s)."""
    return recommend("llama3-70b", gpus=16, hardware="h100-sxm-80gb", suggest=False)


def test_launch_warns_where_the_nodes_nics_are_slower_than_the_plan(tmp_path, two_node_plan):
    plan, step = two_node_plan, two_node_plan.prediction.step_time_s
    full = _sysfs(tmp_path / "full", ib=[(f"mlx5_{i}", 1, "400 Gb/sec (4X NDR)", "4: ACTIVE", "InfiniBand")
                                         for i in range(8)])
    ok = launch.check_network(plan, "cuda", 2, 8, full)
    assert ok.line() == ("[ok  ] network: 8 x 400 Gb/s InfiniBand active on this node, 3200 Gb/s: 50 GB/s a GPU for 8 "
                         "ranks, the plan 50")
    half = _sysfs(tmp_path / "half", ib=[(f"mlx5_{i}", 1, "200 Gb/sec (4X HDR)", "4: ACTIVE", "InfiniBand")
                                         for i in range(4)])
    warn = launch.check_network(plan, "cuda", 2, 8, half)
    assert warn.line().startswith("[warn] network: 4 x 200 Gb/s InfiniBand active on this node, 800 Gb/s: 12.5 GB/s a "
                                  "GPU for 8 ranks, where the plan was predicted at 50 GB/s a GPU across nodes")
    assert warn.detail.endswith("fix: re-plan with --inter-node-bandwidth 12.5") and "TCP" not in warn.detail
    slower = float(warn.detail.split("nearer ")[1].split(" s")[0])
    assert slower > step  # its data-parallel reduction (overlapped with the backward) at a quarter of the rate
    # the flag the fix names plans exactly that step
    replanned = recommend("llama3-70b", gpus=16, hardware="h100-sxm-80gb", suggest=False, inter_node_gbytes_per_s=12.5,
                          pins=Pins(tp=plan.parallel.tp, pp=plan.parallel.pp, dp=plan.parallel.dp, cp=plan.parallel.cp,
                                    mbs=plan.training.micro_batch_size, vpp=plan.parallel.vpp,
                                    zero=plan.parallel.zero_stage, recompute=plan.parallel.recompute,
                                    sp=plan.parallel.sp, schedule=plan.parallel.schedule,
                                    offload=plan.parallel.offload))
    assert replanned.prediction.step_time_s == pytest.approx(slower, rel=1e-3)
    tcp = launch.check_network(plan, "cuda", 2, 8, _sysfs(tmp_path / "tcp", eth=[("eth0", "up", 100000, True)]))
    assert "no RDMA device" in tcp.detail and "--inter-node-bandwidth 1.56" in tcp.detail
    unsure = launch.check_network(plan, "cuda", 2, 8, str(tmp_path / "nothing"))
    assert unsure.line().startswith("[--  ] network:") and "unchecked" in unsure.detail
    assert launch.check_network(plan, "cuda", 1, 8, half) is None  # one node: nothing crosses
    assert launch.check_network(plan, "cpu", 2, 8, half) is None


def test_calibrate_takes_the_nodes_nics_where_they_are_slower_than_the_base():
    from planner.calibrate import apply_nics
    sxm = hardware_profiles.load_profile("h100-sxm-80gb")
    ndr = [topology.NetPort(f"mlx5_{i}/1", 400.0, "InfiniBand") for i in range(8)]
    data, fields = sxm.model_dump(mode="json"), []
    note = apply_nics(data, sxm, ndr + [topology.NetPort("mlx5_8/1", 200.0, "InfiniBand")], fields)
    assert data["inter_node"] == sxm.model_dump(mode="json")["inter_node"] and not fields  # storage NICs: kept
    assert note.startswith("this node's NICs: 8 x 400 Gb/s InfiniBand + 1 x 200 Gb/s InfiniBand active, 3400 Gb/s")
    # four 200 Gb/s ports for eight GPUs: 12.5 GB/s a GPU, the base's efficiency and latency kept
    data, fields = sxm.model_dump(mode="json"), []
    note = apply_nics(data, sxm, [topology.NetPort(f"mlx5_{i}/1", 200.0, "InfiniBand") for i in range(4)], fields)
    prof = HardwareProfile(**data)
    assert prof.inter_node.gbytes_per_s == 12.5 and fields == ["inter_node.gbytes_per_s"]
    assert (prof.inter_node.efficiency, prof.inter_node.latency_s) == (sxm.inter_node.efficiency,
                                                                       sxm.inter_node.latency_s)
    assert "below h100-sxm-80gb's 50: inter_node.gbytes_per_s 12.5" in note and "TCP" not in note
    data = sxm.model_dump(mode="json")
    assert "TCP sockets run slower" in apply_nics(data, sxm, [topology.NetPort("eth0", 100.0, "TCP")], [])
    assert HardwareProfile(**data).inter_node.gbytes_per_s == 1.562
    assert apply_nics(sxm.model_dump(mode="json"), sxm, [], []).startswith("inter_node kept from h100-sxm-80gb")


def _full_mesh(n, cell="NV18"):
    """A node whose every GPU pair NVLink joins (an NVSwitch node, as nvidia-smi prints it)."""
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\n"
    return head + "".join(f"GPU{i}\t" + "\t".join(" X " if i == j else cell for j in range(n)) + "\t0-47\n"
                          for i in range(n))


def test_detect_names_the_profile_and_the_flags_for_this_node():
    pcie = [(i, "NVIDIA H100 PCIe", 81559) for i in range(8)]
    found = topology.detect_node(pcie, topology.parse_topo(CROSSED),
                                 [topology.NetPort(f"mlx5_{i}/1", 200.0, "InfiniBand") for i in range(4)])
    assert found["profile"] == "h100-pcie-80gb" and found["links"] == "pairs"
    assert found["recommend_flags"] == ["--hardware h100-pcie-80gb"]  # 12.5 GB/s a GPU: above the profile's 6.25
    assert any("CUDA_VISIBLE_DEVICES=0,2,1,3,4,5,6,7" in n for n in found["notes"])
    # four SXM GPUs of an NVSwitch node: the node's size is the one flag
    sxm = [(i, "NVIDIA H100 80GB HBM3", 81559) for i in range(4)]
    found = topology.detect_node(sxm, topology.parse_topo(_full_mesh(4)),
                                 [topology.NetPort(f"mlx5_{i}/1", 400.0, "InfiniBand") for i in range(4)])
    assert found["links"] == "all" and found["links_said"] == "NVLink between every pair (NV18)"
    assert found["recommend_flags"] == ["--hardware h100-sxm-80gb", "--gpus-per-node 4"] and len(found["notes"]) == 1
    # eight SXM-named GPUs without NVLink and one 100 Gb/s Ethernet port: both said, the bandwidth flag given
    found = topology.detect_node([(i, "NVIDIA H100 80GB HBM3", 81559) for i in range(8)],
                                 topology.parse_topo(NO_NVLINK.replace("NV12", "PIX")),
                                 [topology.NetPort("eth0", 100.0, "TCP")])
    assert found["recommend_flags"] == ["--hardware h100-sxm-80gb", "--inter-node-bandwidth 1.56"]
    assert any("joins every GPU by NVLink (450 GB/s) and this one does not" in n for n in found["notes"])
    assert any("TCP sockets" in n for n in found["notes"])
    # a GPU without a profile: the default, said so, with calibrate's recipe
    found = topology.detect_node([(0, "NVIDIA RTX 6000 Ada Generation", 49140)], None, [])
    assert not found["profile_matched"] and "parplan calibrate --out my-gpu.toml" in found["notes"][0]
    assert found["links"] == "unknown" and found["inter_node_gbytes_per_gpu"] is None
    # ... whose memory (48 GB) is not the default base's: said too
    assert found["notes"][1].startswith("51.5 GB a GPU here (49,140 MiB) where h100-sxm-80gb plans 85.52: its plans may "
                                        "not fit on this GPU")
    # a GPU with more memory than its profile plans: a GB200 (nvidia-smi 189,471 MiB; gb200-nvl72 holds NVIDIA's 186
    # GB a GPU, not a card's reading). The H100 NVL and then the 144 GB GH200 were this example until each had a
    # profile of its own: the GH200 144G now reads as gh200-144gb, its own memory, with no memory note; an H100 SXM's
    # own reading is no note
    big = topology.detect_node([(0, "NVIDIA GB200", 189471)], None, [])
    assert big["profile"] == "gb200-nvl72" and big["profile_matched"]
    assert big["notes"][0] == ("198.7 GB a GPU here (189,471 MiB) where gb200-nvl72 plans 186: its plans leave memory "
                               "unused on this GPU; `parplan calibrate` writes this GPU's own memory into its profile")
    gh = topology.detect_node([(0, "NVIDIA GH200 144G HBM3e", 146831)], None, [])
    assert gh["profile"] == "gh200-144gb" and gh["notes"] == ["1 GPU here where gh200-144gb's node has 2"]
    nvl = topology.detect_node([(0, "NVIDIA H100 NVL", 95830)], None, [])
    assert nvl["profile"] == "h100-nvl-94gb" and nvl["notes"] == ["1 GPU here where h100-nvl-94gb's node has 8"]
    sxm_notes = topology.detect_node([(0, "NVIDIA H100 80GB HBM3", 81559)], None, [])["notes"]
    assert sxm_notes == ["1 GPU here where h100-sxm-80gb's node has 8"]
    assert topology.parse_smi_gpus("0, NVIDIA H100 PCIe, 81559\n1, NVIDIA H100 PCIe, 81559\n\n") == [
        (0, "NVIDIA H100 PCIe", 81559), (1, "NVIDIA H100 PCIe", 81559)]


def test_hardware_detect_command(monkeypatch, capsys):
    import json

    from planner.cli import main
    monkeypatch.setattr(topology, "read_smi_gpus", lambda: ([(i, "NVIDIA H100 PCIe", 81559) for i in range(8)], ""))
    monkeypatch.setattr(topology, "read_topology", lambda: (topology.parse_topo(CROSSED), ""))
    monkeypatch.setattr(topology, "node_network", lambda: [topology.NetPort("eth0", 100.0, "TCP")])
    assert main(["hardware", "detect", "--json"]) == 0
    out, err = capsys.readouterr()
    found = json.loads(out)
    assert found["recommend_flags"] == ["--hardware h100-pcie-80gb", "--inter-node-bandwidth 1.56"] and not err
    assert main(["hardware", "detect"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("this node: 8 x NVIDIA H100 PCIe (81,559 MiB); NVLink between 0-2 (NV12), 1-3 (NV12), "
                          "4-5 (NV12), 6-7 (NV12) only; NICs: 1 x 100 Gb/s TCP (1.56 GB/s a GPU)")
    assert out.rstrip().endswith("parplan recommend --model MODEL --gpus N --hardware h100-pcie-80gb "
                                 "--inter-node-bandwidth 1.56")
    monkeypatch.setattr(topology, "read_smi_gpus", lambda: ([], "nvidia-smi is not on PATH"))
    assert main(["hardware", "detect"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.startswith("error: no NVIDIA GPU found here (nvidia-smi is not on PATH)") and \
        "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_nvidia_smi_is_run_and_read(tmp_path, monkeypatch):
    """The subprocess path: a stand-in nvidia-smi on PATH prints the matrix and the GPU list; one that fails is said."""
    (tmp_path / "topo.txt").write_text(CROSSED)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ "$1" = topo ]; then cat {tmp_path / "topo.txt"}; else\n'
                   'printf "0, NVIDIA H100 PCIe, 81559\\n1, NVIDIA H100 PCIe, 81559\\n"; fi\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    topo, why = topology.read_topology()
    assert why == "" and topo.nvlinked(0, 2) and not topo.nvlinked(0, 1)
    assert topology.read_smi_gpus() == ([(0, "NVIDIA H100 PCIe", 81559), (1, "NVIDIA H100 PCIe", 81559)], "")
    smi.write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
                   "exit 9\n")
    assert topology.read_topology() == (None, "nvidia-smi printed no GPU matrix (topo -m) (NVIDIA-SMI has failed "
                                              "because it couldn't communicate with the NVIDIA driver.)")
    assert topology.read_smi_gpus()[0] == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert topology.read_topology() == (None, "nvidia-smi is not on PATH")


def test_launch_prints_the_runs_host():
    assert launch.host_line({"host": {"cpu": "Intel(R) Xeon(R) Processor", "logical_cpus": 16, "usable_cpus": 12,
                                      "probe_cpu_op_us": 2.1, "probe_cuda_launch_us": 4.3}}) == (
        "host: Intel(R) Xeon(R) Processor, 12 CPUs; dispatch probes 2.1 us a CPU op, 4.3 us a kernel launch")
    assert launch.host_line({"host": {"cpu": "x", "logical_cpus": 2, "usable_cpus": None, "probe_cpu_op_us": 5.0}}) \
        == "host: x, 2 CPUs; dispatch probes 5.0 us a CPU op"
    assert launch.host_line({}) is None and launch.host_line({"host": None}) is None
