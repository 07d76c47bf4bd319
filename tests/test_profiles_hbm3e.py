"""The HBM3e siblings of two 96 GB Hopper profiles: h20-3e-141gb (the H20 with 141 GB of HBM3e, on the H20's HGX
node) and gh200-144gb (the 144 GB HBM3e Grace Hopper superchip in a GH200 NVL2 node). Each loads, holds its cited
figures and says where every other one comes from, is found by the name nvidia-smi and torch print for it (and its
96 GB sibling keeps its own), and plans with the memory it has: what fits on it and not on its sibling."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hardware_profiles import canonical_name, load_profile
from planner.core import NothingFits, recommend
from planner.schema import ModelSpec
from planner.search import Pins
from tests.test_profiles_more import _tags

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 ** 2
# profile -> (its 96 GB sibling, nvidia-smi's name, nvidia-smi's memory.total in MiB)
NEW = {
    "h20-3e-141gb": ("h20-96gb", "NVIDIA H20-3e", 143771),
    "gh200-144gb": ("gh200-96gb", "NVIDIA GH200 144G HBM3e", 146831),
}


# (each ships, loads and cites its figures: tests/test_profiles_more.py's test_each_ships_and_loads)


@pytest.mark.parametrize("name", NEW)
def test_memory_is_nvidia_smis_reading(name):
    """hbm_gbytes is nvidia-smi's memory.total in bytes (143,771 MiB on an H20-3e, the H200's; 146,831 MiB on a
    GH200 144G), 1.47x and 1.50x the 96 GB siblings' 97,871 MiB."""
    sibling, _, mib = NEW[name]
    p, s = load_profile(name), load_profile(sibling)
    assert p.hbm_gbytes == pytest.approx(mib * MIB / 1e9, abs=0.005)
    assert s.hbm_gbytes == pytest.approx(97871 * MIB / 1e9, abs=0.005)
    assert p.memory_reserve_gbytes == s.memory_reserve_gbytes


def test_the_h20_3e_is_the_h20_with_more_memory():
    """The H20's peaks, curves and node; its HBM3e at the H200's 4.8 TB/s (assumed: no source gives its own), its
    NICs one 400 Gb/s RoCE port a GPU as nccl#2238 prints them."""
    p, h20, h200 = load_profile("h20-3e-141gb"), load_profile("h20-96gb"), load_profile("h200-sxm-141gb")
    assert p.peak_dense_tflops == h20.peak_dense_tflops and p.peak_dense_tflops["bf16"] == 148.0
    assert p.matmul_efficiency_curve == h20.matmul_efficiency_curve
    assert p.attention_efficiency_curve == h20.attention_efficiency_curve and p.fp8_matmul_scale == h20.fp8_matmul_scale
    assert p.gpus_per_node == 8 and p.nvlink.gbytes_per_s == h20.nvlink.gbytes_per_s == 450.0
    assert p.hbm_gbytes == pytest.approx(h200.hbm_gbytes, abs=0.01)
    assert p.hbm_gbytes_per_s == h200.hbm_gbytes_per_s == 4800.0 and h20.hbm_gbytes_per_s == 4000.0
    tags = _tags(p)
    assert "ASSUMPTION" in tags["hbm"] and "4.8 TB/s" in tags["hbm"]
    assert "NVIDIA/nccl issue #2238" in tags["node"] and "400 Gb/s RoCE" in tags["node"]
    assert p.inter_node.gbytes_per_s == 400 / 8
    assert "sustained_matmul_fraction" not in p.model_fields_set  # as the H20: not the H100's fraction


def test_the_gh200_144gb_is_measured_where_the_96gb_one_assumes():
    """The MAMF table's GH200 rows were measured on the 144 GB HBM3e superchip (at 900 W): this profile's GEMM
    ceiling and FP8 ratio are that part's own, the 96 GB profile's the same figures carried over; 4.9 TB/s from
    NVIDIA's datasheet; two superchips a node (GH200 NVL2), NVLink-C2C to each one's Grace."""
    p, g96 = load_profile("gh200-144gb"), load_profile("gh200-96gb")
    assert p.peak_dense_tflops == g96.peak_dense_tflops
    assert p.matmul_efficiency_curve == g96.matmul_efficiency_curve and p.fp8_matmul_scale == g96.fp8_matmul_scale
    assert p.hbm_gbytes_per_s == 4900.0 and "Up to 4.9TB/s" in _tags(p)["datasheet"]
    tags = _tags(p)
    assert "900W 141GB HBM3e version" in tags["efficiency"] and "ASSUMPTION" not in tags["efficiency"]
    assert "ASSUMPTION" in _tags(g96)["efficiency"]  # the 96 GB profile borrows this part's figure
    assert p.gpus_per_node == 2 and p.nvlink.mesh_links is None and p.host_link_gbytes_per_s == 900 / 2
    assert p.host_memory_gbytes_per_node == 2 * 480 and p.host_memory_gbytes_per_s_per_node == 2 * 384
    assert "ASSUMPTION" in tags["nvlink"] and "GH200 NVL2" in tags["node"]
    assert p.sustained_matmul_fraction == g96.sustained_matmul_fraction


@pytest.mark.parametrize("name", NEW)
def test_the_device_name_finds_its_own_profile(name):
    """calibrate's base, `hardware detect` and --hardware take the device's name to the new profile, and the 96 GB
    sibling's name still to the sibling."""
    from planner.calibrate import base_for_device
    from planner.topology import detect_node
    sibling, device, mib = NEW[name]
    assert base_for_device(device) == (name, True)
    assert canonical_name(device) == name and load_profile(device).name == name
    gpus = load_profile(name).gpus_per_node
    found = detect_node([(i, device, mib) for i in range(gpus)], None, [])
    assert found["profile"] == name and found["profile_matched"] and found["notes"] == []
    assert found["recommend_flags"] == [f"--hardware {name}"]
    sibling_device = {"h20-96gb": "NVIDIA H20", "gh200-96gb": "NVIDIA GH200 480GB"}[sibling]
    assert base_for_device(sibling_device) == (sibling, True) and canonical_name(sibling_device) == sibling
    assert canonical_name(sibling.split("-")[0]) == sibling  # "h20", "gh200": the 96 GB part


def test_the_hbm3e_parts_are_their_own_gpu_families():
    """A plan for the 96 GB part launched on the HBM3e one (or the other way) is another GPU's prediction: warned."""
    from planner import launch as L
    from tests.runtime_helpers.plans import check_card_warnings
    assert L.profile_family(load_profile("h20-3e-141gb")) == L.gpu_family("NVIDIA H20-3e") == "H20 3E"
    assert L.profile_family(load_profile("gh200-144gb")) == L.gpu_family("NVIDIA GH200 144G HBM3e") == "GH200 144G"
    check_card_warnings("h20-3e-141gb", "NVIDIA H20-3e", ("NVIDIA H20", "NVIDIA H200"))
    check_card_warnings("h20-96gb", "NVIDIA H20", ("NVIDIA H20-3e",))
    check_card_warnings("gh200-144gb", "NVIDIA GH200 144G HBM3e", ("NVIDIA GH200 480GB", "NVIDIA H200"))
    check_card_warnings("gh200-96gb", "NVIDIA GH200 480GB", ("NVIDIA GH200 144G HBM3e",))


def _recommend_cli(hardware: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--params", "70e9", "--gpus", "8",
                          "--hardware", hardware, "--json", "--top", "1"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", NEW)
def test_a_70b_on_8_fits_what_the_96gb_sibling_cannot_hold(name):
    """`parplan recommend --params 70e9 --gpus 8 --hardware NAME` runs on both parts; the HBM3e part's best plan holds
    more per GPU than its sibling's whole usable memory, and that layout pinned on the sibling does not fit."""
    sibling = NEW[name][0]
    big, small = _recommend_cli(name), _recommend_cli(sibling)
    pred = big["prediction"]
    assert big["hardware"]["name"] == name and pred["fits"] and small["prediction"]["fits"]
    assert pred["usable_memory_bytes"] > 1.4 * small["prediction"]["usable_memory_bytes"]
    assert pred["memory_bytes_per_gpu"]["total"] > small["prediction"]["usable_memory_bytes"]
    par = big["parallel"]
    pins = Pins(tp=par["tp"], pp=par["pp"], dp=par["dp"], cp=par["cp"], mbs=big["training"]["micro_batch_size"],
                zero=par["zero_stage"], recompute=par["recompute"], sp=par["sp"], offload=par["offload"],
                schedule=par["schedule"])
    spec = ModelSpec(**big["model"])
    with pytest.raises(NothingFits, match=f"usable on {sibling}"):
        recommend(spec, 8, hardware=sibling, pins=pins, suggest=False, top_k=1)
    here = recommend(spec, 8, hardware=name, pins=pins, suggest=False, top_k=1)
    assert here.prediction.fits

