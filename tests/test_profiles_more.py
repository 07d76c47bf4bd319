"""Three more Hopper profiles: h100-nvl-94gb (the H100 NVL PCIe card, bridged in pairs), h20-96gb (the China-market
H20 on an HGX node) and gh200-96gb (the Grace Hopper superchip in the quad-GH200 node of JUPITER and Alps). Each
loads, holds its cited datasheet figures, says where every other figure comes from, is found by the GPU's name as
nvidia-smi prints it without taking another card's name, and plans in the order its figures say."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hardware_profiles import PROFILE_DIR, canonical_name, list_profiles, load_profile
from planner.core import recommend
from planner.models import load_preset
from planner.search import Pins

NEW = ("h100-nvl-94gb", "h20-96gb", "gh200-96gb")
MIB = 1024 ** 2


def _tags(prof) -> dict:
    return {m.group(1): s for s in prof.sources for m in [re.match(r"\[([\w-]+)\] ", s)] if m}


@pytest.mark.parametrize("name", NEW + ("h20-3e-141gb", "gh200-144gb"))  # (the latter two: test_profiles_hbm3e.py)
def test_each_ships_and_loads(name):
    assert name in list_profiles()
    p = load_profile(name)
    assert p.name == name and p.sources and p.description
    text = (PROFILE_DIR / f"{name}.toml").read_text(encoding="utf-8")
    assert "ASSUMPTION" in text  # what no source gives is said to be assumed
    # no figure without its source: every tagged comment's tag is one of the sources
    assert set(re.findall(r"#.*?\[([\w-]+)\]", text)) <= set(_tags(p))


def test_the_h100_nvl_holds_its_datasheet_figures():
    """NVIDIA's H100 NVL column: 1,671 BF16 / 835 TF32 / 3,341 FP8 TFLOPS with sparsity (halved), FP32 60, 94 GB at
    3.9 TB/s, NVLink 600 GB/s bidirectional to its bridged partner, PCIe Gen5 x16; nvidia-smi's 95,830 MiB."""
    p = load_profile("h100-nvl-94gb")
    assert p.peak_dense_tflops == {"bf16": 1671 / 2, "fp16": 1671 / 2, "tf32": 835 / 2, "fp32": 60.0, "fp8": 3341 / 2}
    assert p.hbm_gbytes_per_s == 3900.0 and p.hbm_gbytes == pytest.approx(95830 * MIB / 1e9, abs=0.005)
    assert p.nvlink.bridge_gbytes_per_s == 600 / 2 and p.nvlink.gbytes_per_s == 128 / 2
    # the bridge's efficiency is the H100 PCIe's measured pair (the same 600 GB/s bridge), said to be so
    assert p.nvlink.bridge_efficiency == load_profile("h100-pcie-80gb").nvlink.bridge_efficiency
    assert "measured on the H100 PCIe's bridge" in _tags(p)["nccl-pair"] and "ASSUMPTION" in _tags(p)["nccl-pair"]
    # its GEMM ceiling, assumed the H100 PCIe's, at its own peak: the PCIe card's curve with a wider GFLOP axis
    pcie = load_profile("h100-pcie-80gb")
    assert [e for _, e in p.matmul_efficiency_curve] == [e for _, e in pcie.matmul_efficiency_curve]
    assert p.matmul_efficiency_curve[-1][0] == pytest.approx(pcie.matmul_efficiency_curve[-1][0] * 835.5 / 756, rel=1e-4)
    assert "ASSUMPTION" in _tags(p)["efficiency"] and "451 TFLOP/s" in _tags(p)["efficiency"]


def test_the_h20_holds_its_specification():
    """148 dense BF16 TFLOP/s (a sixth of the H100's 989.4), FP8 296, TF32 74, FP32 44; 96 GB HBM3 at 4.0 TB/s
    (nvidia-smi 97,871 MiB); the H100 SXM's NVLink (900 GB/s) and NVSwitch node of 8."""
    p, h100 = load_profile("h20-96gb"), load_profile("h100-sxm-80gb")
    assert p.peak_dense_tflops == {"bf16": 148.0, "fp16": 148.0, "tf32": 74.0, "fp32": 44.0, "fp8": 296.0}
    assert p.hbm_gbytes_per_s == 4000.0 and p.hbm_gbytes == pytest.approx(97871 * MIB / 1e9, abs=0.005)
    assert p.nvlink.gbytes_per_s == 900 / 2 == h100.nvlink.gbytes_per_s and p.nvlink.mesh_links is None
    assert p.gpus_per_node == 8 and p.nvlink.bridge_gbytes_per_s is None
    # the H100 SXM's curve shape and ceiling (an assumption), on an axis scaled to the H20's peak
    assert [e for _, e in p.matmul_efficiency_curve] == [e for _, e in h100.matmul_efficiency_curve]
    for (x, _), (xh, _) in zip(p.matmul_efficiency_curve, h100.matmul_efficiency_curve):
        assert x == pytest.approx(xh * 148 / 989.4, rel=1e-4)
    tags = _tags(p)
    for tag in ("efficiency", "fp8-eff", "nccl-bw", "node", "host"):
        assert "ASSUMPTION" in tags[tag], tag
    assert tags["efficiency"].startswith("[efficiency] same silicon as the H100 SXM")
    # the H100's fitted fraction is not carried to a GPU six times slower (its plans say they are uncalibrated)
    assert "sustained_matmul_fraction" not in p.model_fields_set


def test_the_gh200_holds_the_quad_node_figures():
    """JUPITER's Booster node: four GH200 (96 GB HBM3 at 4 TB/s, nvidia-smi 97,871 MiB), their GPUs NVLinked in
    pairs at 150 GB/s a direction (a full mesh of 3 links), one NDR200 (200 Gb/s) NIC each, NVLink-C2C at 450 GB/s a
    direction to a Grace of 120 GB at 512 GB/s; the H100 SXM's peaks, the MAMF table's own GH200 ceiling."""
    p, h100 = load_profile("gh200-96gb"), load_profile("h100-sxm-80gb")
    assert p.peak_dense_tflops == h100.peak_dense_tflops and p.peak_dense_tflops["bf16"] == 989.4
    assert p.hbm_gbytes_per_s == 4000.0 and p.hbm_gbytes == pytest.approx(97871 * MIB / 1e9, abs=0.005)
    assert p.gpus_per_node == 4 and p.nvlink.mesh_links == 3 and p.nvlink.gbytes_per_s == 3 * 150
    assert p.inter_node.gbytes_per_s == 200 / 8 and not p.inter_node.aggregate_nics
    assert p.host_link_gbytes_per_s == 900 / 2
    assert p.host_memory_gbytes_per_node == 4 * 120 and p.host_memory_gbytes_per_s_per_node == 4 * 512
    # the MAMF table's GH200 rows: BF16 828.6 of 989 (83.6 %), FP8 1,535.0 of 1,979
    ceiling = max(e for _, e in p.matmul_efficiency_curve) / max(e for _, e in h100.matmul_efficiency_curve)
    assert ceiling == pytest.approx(0.836 / 0.803, abs=2e-4)
    assert p.fp8_matmul_scale == pytest.approx((1535.0 / 1979) / (828.6 / 989), abs=5e-4)
    tags = _tags(p)
    assert "apps.fz-juelich.de/jsc/hps/jupiter/configuration.html" in tags["node"]
    assert "150 GB/s per direction" in tags["node"] and "4x InfiniBand NDR200" in tags["node"]
    assert "ASSUMPTION" in tags["efficiency"] and "ASSUMPTION" in tags["fitted"]
    assert p.sustained_matmul_fraction == h100.sustained_matmul_fraction  # carried, as the H200's (the same die)


def test_the_gh200_mesh_and_the_nvl_bridge_price_groups_as_their_links():
    """A pair of GH200s drives one 150 GB/s link, four GPUs their three each; an H100 NVL's bridged pair runs at the
    bridge, any other group of its node over PCIe; the H20's NVSwitch gives every group the whole 450 GB/s."""
    from cost_models import comm
    from cost_models.hardware import constants_from_profile
    stride, size = np.array([1, 2, 1, 1]), np.array([2, 2, 4, 8])
    rates = {}
    for name in NEW:
        hw = constants_from_profile(load_profile(name))
        rates[name] = comm.tier_params(hw, True, size, pair=comm.one_pair(stride, size))[0] / 1e9
    assert rates["gh200-96gb"] == pytest.approx([150 * 0.8, 150 * 0.8, 450 * 0.8, 450 * 0.8])
    assert rates["h100-nvl-94gb"] == pytest.approx([300 * 0.387, 64 * 0.625, 64 * 0.625, 64 * 0.625])
    assert np.allclose(rates["h20-96gb"], 450 * 0.8)


# the names nvidia-smi prints, and where each belongs
SMI = {
    "NVIDIA H100 NVL": "h100-nvl-94gb",
    "NVIDIA H20": "h20-96gb",
    "NVIDIA GH200 480GB": "gh200-96gb",
    "NVIDIA GH200 144G HBM3e": "gh200-144gb",  # the HBM3e superchip's own profile since it has one
    "NVIDIA H20-3e": "h20-3e-141gb",  # the 141 GB H20's own, not the 96 GB part's
    # the other cards keep theirs
    "NVIDIA H200": "h200-sxm-141gb",
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "NVIDIA H800": "h800-sxm-80gb",
    "NVIDIA GB200": "gb200-nvl72",
}


@pytest.mark.parametrize("device, profile", SMI.items())
def test_calibrate_and_hardware_detect_take_the_gpu_name_to_its_profile(device, profile):
    from planner.calibrate import base_for_device
    assert base_for_device(device) == (profile, True)


def test_hardware_takes_the_gpu_name_without_stealing_anothers():
    """--hardware as nvidia-smi prints the GPU, or its name alone: the new profiles for their cards, and 'h20' is
    not h200's (nor the H20-3e's), 'h100' still the SXM part (not the PCIe or NVL card), 'h200' not the GH200's,
    'gh200' the 96 GB HBM3 part's (the 144 GB one names its memory)."""
    spelled = {n: canonical_name(n) for n in ("NVIDIA H100 NVL", "h100_nvl", "H100-NVL-94GB", "NVIDIA H20", "h20",
                                               "H20", "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e", "gh200")}
    assert spelled == {"NVIDIA H100 NVL": "h100-nvl-94gb", "h100_nvl": "h100-nvl-94gb", "H100-NVL-94GB": "h100-nvl-94gb",
                       "NVIDIA H20": "h20-96gb", "h20": "h20-96gb", "H20": "h20-96gb",
                       "NVIDIA GH200 480GB": "gh200-96gb", "NVIDIA GH200 144G HBM3e": "gh200-144gb", "gh200": "gh200-96gb"}
    assert [canonical_name(n) for n in ("h100", "NVIDIA H100 PCIe", "h200", "NVIDIA H200", "gb200", "a100")] == \
        ["h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "h200-sxm-141gb", "gb200-nvl72", "a100"]
    assert load_profile("h20").name == "h20-96gb" and load_profile("NVIDIA GH200 480GB").name == "gh200-96gb"
    # the H20-3e (141 GB of HBM3e) has a profile of its own since 2026-12 (it was offered the H20's, not taken)
    from planner.calibrate import base_for_device
    assert base_for_device("NVIDIA H20-3e") == ("h20-3e-141gb", True)
    assert load_profile("NVIDIA H20-3e").name == "h20-3e-141gb"
    # the SXM parts' whole names as nvidia-smi prints them, their memory and kind of HBM in the middle (refused
    # until 2026-12-07), as calibrate reads them; a device no profile describes stays as given (an unknown name)
    assert [canonical_name(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB",
                                        "NVIDIA H800 PCIe", "NVIDIA RTX 6000 Ada Generation")] == \
        ["h100-sxm-80gb", "a100-sxm-40gb", "a100-sxm-80gb", "NVIDIA H800 PCIe", "NVIDIA RTX 6000 Ada Generation"]


def test_launch_families_and_accuracy_kinds_tell_the_new_cards_apart():
    from planner import accuracy
    from planner import launch as L
    assert [L.gpu_family(n) for n in ("NVIDIA H100 NVL", "h100-nvl-94gb", "NVIDIA H20", "h20-96gb", "NVIDIA H20-3e",
                                      "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e", "gh200-96gb", "NVIDIA H200",
                                      "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe")] == \
        ["H100 NVL", "H100 NVL", "H20", "H20", "H20 3E", "GH200", "GH200 144G", "GH200", "H200", "H100", "H100 PCIE"]
    assert {n: accuracy.gpu_kind(n) for n in NEW + ("h200-sxm-141gb", "h100-sxm-80gb", "h100-pcie-80gb")} == \
        {"h100-nvl-94gb": "h100-nvl", "h20-96gb": "h20", "gh200-96gb": "gh200", "h200-sxm-141gb": "h200",
         "h100-sxm-80gb": "h100", "h100-pcie-80gb": "h100-pcie"}
    for name, kind in (("h100-nvl-94gb", "H100-NVL"), ("h20-96gb", "H20"), ("gh200-96gb", "GH200")):
        assert f"none launched on {name}" in accuracy.line("parplan", name)
        assert accuracy.line("megatron", name).startswith(f"how accurate: none published on {kind}; ")
    # a plan for one card run on another is warned of
    from tests.runtime_helpers.plans import check_card_warnings
    check_card_warnings("h100-nvl-94gb", "NVIDIA H100 NVL", ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"))


def test_hardware_detect_reads_each_node_as_its_profile():
    from planner.topology import detect_node
    for device, mib, n, name in (("NVIDIA H20", 97871, 8, "h20-96gb"), ("NVIDIA GH200 480GB", 97871, 4, "gh200-96gb")):
        found = detect_node([(i, device, mib) for i in range(n)], None, [])
        assert found["profile"] == name and found["profile_matched"] and found["notes"] == [], device
        assert found["recommend_flags"] == [f"--hardware {name}"]


def test_the_h20_computes_at_a_sixth_of_the_h100s_rate(tmp_path):
    """llama3-70b on 8 GPUs, one layout on both: the H20's attention takes 989.4/148 of the H100's (both at the H100's
    curve, the H100 without its sustained fraction, which the H20 does not carry), its compute (GEMMs at that ratio,
    the memory-bound passes faster on its 4.0 TB/s) a little less; as shipped, its step over four times the H100's."""
    spec = load_preset("llama3-70b")
    data = load_profile("h100-sxm-80gb").model_dump(exclude_none=True)
    del data["sustained_matmul_fraction"]
    (tmp_path / "h100-bare.json").write_text(json.dumps({**data, "name": "h100-bare"}))
    pins = Pins(tp=8, pp=1, dp=1, cp=1, mbs=1, zero=1, recompute="full", sp=True)
    bare = recommend(spec, 8, hardware=str(tmp_path / "h100-bare.json"), pins=pins, suggest=False, top_k=1)
    h20 = recommend(spec, 8, hardware="h20-96gb", pins=pins, suggest=False, top_k=1)
    a, b = bare.prediction.time_breakdown, h20.prediction.time_breakdown
    assert bare.prediction.fits and h20.prediction.fits
    assert b.attention_s / a.attention_s == pytest.approx(989.4 / 148, rel=1e-6)
    assert 0.85 * 989.4 / 148 < b.compute_s / a.compute_s < 989.4 / 148
    best = {hw: recommend(spec, 8, hardware=hw, suggest=False, top_k=1).prediction for hw in ("h100-sxm-80gb", "h20-96gb")}
    assert best["h20-96gb"].step_time_s > 4 * best["h100-sxm-80gb"].step_time_s
    assert any(w.startswith("uncalibrated") for w in best["h20-96gb"].warnings)


def test_a_tp2_plan_on_the_h100_nvl_prices_the_pair_at_its_bridge(tmp_path):
    """llama3-70b on 16 H100 NVL at tp 2 pp 8: the pair's collectives at the bridge's 116 GB/s make its step shorter
    than the same card without bridges (every group over PCIe), and the plan says it counts on them; the NVL's
    faster GEMMs (835.5 TFLOP/s at the H100 PCIe's ceiling) step it ahead of the H100 PCIe on the same layout."""
    data = load_profile("h100-nvl-94gb").model_dump(exclude_none=True)
    del data["nvlink"]["bridge_gbytes_per_s"], data["nvlink"]["bridge_efficiency"]
    (tmp_path / "nobridge.json").write_text(json.dumps({**data, "name": "h100-nvl-nobridge"}))
    spec = load_preset("llama3-70b")
    pins = Pins(tp=2, pp=8, dp=1, cp=1)
    plan = lambda hw: recommend(spec, 16, hardware=hw, pins=pins, suggest=False, top_k=1)  # noqa: E731
    nvl, bare, pcie = plan("h100-nvl-94gb"), plan(str(tmp_path / "nobridge.json")), plan("h100-pcie-80gb")
    assert nvl.parallel.tp == 2 and nvl.prediction.fits
    assert nvl.prediction.time_breakdown.tp_comm_s < bare.prediction.time_breakdown.tp_comm_s
    assert nvl.prediction.step_time_s < bare.prediction.step_time_s
    assert any(w.startswith("NVLink bridges:") for w in nvl.prediction.warnings)
    assert nvl.prediction.time_breakdown.compute_s < pcie.prediction.time_breakdown.compute_s


def test_the_gh200_plans_as_fast_as_the_h100_per_gpu_on_its_own_ceiling():
    """The same GPU at the MAMF table's GH200 ceiling (83.6 % against the H100 SXM's 80.3 %): llama3-8b on 4 GPUs (one
    quad node) at dp 4, one layout on both, computes about 0.803/0.836 of the H100's time."""
    spec = load_preset("llama3-8b")
    pins = Pins(tp=1, pp=1, dp=4, cp=1, mbs=1, zero=1, recompute="full")
    h100 = recommend(spec, 4, hardware="h100-sxm-80gb", pins=pins, suggest=False, top_k=1).prediction
    gh200 = recommend(spec, 4, hardware="gh200-96gb", pins=pins, suggest=False, top_k=1).prediction
    ratio = gh200.time_breakdown.compute_s / h100.time_breakdown.compute_s
    assert 0.803 / 0.836 - 0.01 < ratio < 1.0
    assert not any(w.startswith("uncalibrated") for w in gh200.warnings)
