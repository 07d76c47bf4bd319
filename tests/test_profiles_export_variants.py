"""The export-market SXM parts, h800-sxm-80gb and a800-sxm-80gb: each is its twin's profile (h100-sxm-80gb,
a100-sxm-80gb: the same silicon) with the NVLink cut to 400 GB/s bidirectional, says where every shared figure
comes from, plans, steps slower than its twin where tensor parallelism crosses the NVLink, and is found by the
GPU's name as nvidia-smi prints it (the SXM parts only: the PCIe cards of either have no profile)."""
from __future__ import annotations

import re

import pytest

from hardware_profiles import PROFILE_DIR, canonical_name, list_profiles, load_profile
from planner.core import recommend
from planner.models import load_preset
from planner.search import Pins

TWINS = {"h800-sxm-80gb": "h100-sxm-80gb", "a800-sxm-80gb": "a100-sxm-80gb"}
# what a variant may hold otherwise than its twin: who it is, where its numbers come from, and its NVLink's rate
OWN = {"name", "description", "measured", "sources"}


@pytest.mark.parametrize("variant, twin", TWINS.items())
def test_the_variant_is_its_twin_but_for_the_nvlink_rate(variant, twin):
    """Compute, HBM, curves, fitted fraction, host dispatch, the NVLink's latency and efficiency and the node's
    network: the twin's, field for field; only [nvlink] gbytes_per_s differs, 400 GB/s bidirectional a GPU."""
    assert variant in list_profiles()
    v, t = load_profile(variant), load_profile(twin)
    assert v.name == variant and "NVLink 400 GB/s bidirectional" in v.description
    vd, td = v.model_dump(), t.model_dump()
    for key in sorted(set(vd) | set(td)):
        if key in OWN:
            continue
        if key == "nvlink":
            assert {k: x for k, x in vd[key].items() if k != "gbytes_per_s"} == \
                {k: x for k, x in td[key].items() if k != "gbytes_per_s"}
        else:
            assert vd[key] == td[key], key
    assert v.peak_dense_tflops == t.peak_dense_tflops and v.hbm_gbytes_per_s == t.hbm_gbytes_per_s
    assert v.matmul_efficiency_curve == t.matmul_efficiency_curve
    assert v.attention_efficiency_curve == t.attention_efficiency_curve
    # the cited rate: 400 GB/s bidirectional, 200 a direction, below the twin's (H100 900 -> 450, A100 600 -> 300)
    assert v.nvlink.gbytes_per_s == 400 / 2 < t.nvlink.gbytes_per_s
    assert v.gpus_per_node == t.gpus_per_node == 8 and v.nvlink.bridge_gbytes_per_s is None


def test_the_h800_profile_cites_deepseeks_node_and_its_nvlink():
    text = (PROFILE_DIR / "h800-sxm-80gb.toml").read_text(encoding="utf-8")
    for cited in ("arXiv 2412.19437", "2048 NVIDIA H800", "NVLink offers a bandwidth of 160 GB/s", "IB (50 GB/s)",
                  "deepseek-ai/DeepEP issue #16", "nominal bandwidth of 200GB/s", "CX7 InfiniBand 400 Gb/s"):
        assert cited in text, cited
    h800 = load_profile("h800-sxm-80gb")
    # the kept efficiency puts an 8-GPU all-reduce's bus bandwidth at DeepSeek's measured 160 GB/s a direction
    assert h800.nvlink.gbytes_per_s * h800.nvlink.efficiency == pytest.approx(160)
    assert h800.inter_node.gbytes_per_s == 50.0 and not h800.inter_node.aggregate_nics


@pytest.mark.parametrize("variant, twin", TWINS.items())
def test_every_shared_figure_says_it_is_the_twins(variant, twin):
    """A curve, peak or fitted fraction carried over says it was measured or fitted on the twin, never the variant;
    what nothing sourced is marked ASSUMPTION; the generator derives the variant's curves as its twin's."""
    prof = load_profile(variant)
    gpu = {"h100-sxm-80gb": "H100 SXM", "a100-sxm-80gb": "A100 SXM"}[twin]
    by_tag = {m.group(1): s for s in prof.sources for m in [re.match(r"\[([\w-]+)\] ", s)] if m}
    for tag in ("peak", "hbm", "efficiency", "fitted", "fa2", "nccl-bw", "nccl-lat", "host-link"):
        assert by_tag[tag].startswith(f"[{tag}] same silicon as the {gpu}"), tag
    assert "ASSUMPTION" in by_tag["fitted"] and f"no {variant[:4].upper()}" in by_tag["efficiency"]
    text = (PROFILE_DIR / f"{variant}.toml").read_text(encoding="utf-8")
    assert re.search(r"^# fitted: sustained_matmul_fraction .*carried from " + twin, text, re.M)
    assert "ASSUMPTION" in text
    if prof.host_block_s:  # the H800's, the H100 node's dispatch
        assert "measured there" in by_tag["host"] and prof.measured.startswith("nothing on an H800")
    import importlib.util
    spec = importlib.util.spec_from_file_location("b", PROFILE_DIR.parent / "benchmarks" / "build_h100_curve.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert build.TARGETS[variant][:2] == build.TARGETS[twin][:2]


@pytest.mark.parametrize("variant", sorted(TWINS))
def test_llama3_70b_on_64_gpus_plans_on_each(variant):
    plan = recommend(load_preset("llama3-70b"), 64, hardware=variant, suggest=False, top_k=1)
    assert plan.prediction.fits and plan.prediction.step_time_s > 0 and plan.hardware.name == variant
    assert not any(w.startswith("uncalibrated") for w in plan.prediction.warnings)  # the twin's fitted fraction


@pytest.mark.parametrize("variant, twin", TWINS.items())
def test_tensor_parallelism_at_8_steps_slower_on_the_cut_nvlink(variant, twin):
    """llama3-70b on 64 GPUs at tp 8 (recommend's best layout on the twin, pinned on both): the same compute, and
    the variant's tensor-parallel collectives, on NVLink at 200 GB/s a direction, make its step the longer."""
    spec = load_preset("llama3-70b")
    base = recommend(spec, 64, hardware=twin, pins=Pins(tp=8), suggest=False, top_k=1)
    par, tr = base.parallel, base.training
    pins = Pins(tp=par.tp, pp=par.pp, dp=par.dp, cp=par.cp, mbs=tr.micro_batch_size, vpp=par.vpp,
                zero=par.zero_stage, recompute=par.recompute, sp=par.sp, schedule=par.schedule)
    cut = recommend(spec, 64, hardware=variant, pins=pins, suggest=False, top_k=1)
    assert cut.parallel.tp == base.parallel.tp == 8
    a, b = base.prediction.time_breakdown, cut.prediction.time_breakdown
    assert b.compute_s == pytest.approx(a.compute_s) and b.attention_s == pytest.approx(a.attention_s)
    assert b.tp_comm_s > a.tp_comm_s
    assert cut.prediction.step_time_s > base.prediction.step_time_s
    assert cut.prediction.mfu < base.prediction.mfu


def test_the_sxm_names_find_their_profiles_and_the_pcie_cards_none():
    """calibrate's base (and so `hardware detect`) and --hardware: the H800's and A800's SXM parts by their
    nvidia-smi names; their PCIe cards, which no profile describes, stay unmatched (the default base, said so)."""
    from planner.calibrate import DEFAULT_BASE, base_for_device
    for device, name in (("NVIDIA H800", "h800-sxm-80gb"), ("NVIDIA H800 80GB HBM3", "h800-sxm-80gb"),
                         ("NVIDIA A800-SXM4-80GB", "a800-sxm-80gb")):
        assert base_for_device(device) == (name, True), device
    for pcie in ("NVIDIA H800 PCIe", "NVIDIA H800 NVL", "NVIDIA A800 80GB PCIe", "NVIDIA A800-PCIE-40GB"):
        assert base_for_device(pcie) == (DEFAULT_BASE, False), pcie
    # the twins are found as before
    assert base_for_device("NVIDIA H100 80GB HBM3") == ("h100-sxm-80gb", True)
    assert base_for_device("NVIDIA A100-SXM4-80GB") == ("a100-sxm-80gb", True)
    # --hardware h800 / a800, as --hardware h100 reads the H100's SXM part
    assert [canonical_name(n) for n in ("h800", "H800", "NVIDIA H800", "a800", "A800", "h800_sxm")] == \
        ["h800-sxm-80gb"] * 3 + ["a800-sxm-80gb"] * 2 + ["h800-sxm-80gb"]
    assert load_profile("h800").name == "h800-sxm-80gb" and load_profile("a800").name == "a800-sxm-80gb"
    assert canonical_name("a100") == "a100" and canonical_name("h100") == "h100-sxm-80gb"
    with pytest.raises(ValueError, match=r"'NVIDIA H800 PCIe' \(did you mean h800-sxm-80gb\?\)"):
        load_profile("NVIDIA H800 PCIe")  # offered, not taken: another node


def test_hardware_detect_reads_an_h800_node_as_its_profile():
    from planner.topology import detect_node
    h800 = detect_node([(i, "NVIDIA H800", 81559) for i in range(8)], None, [])
    assert h800["profile"] == "h800-sxm-80gb" and h800["profile_matched"] and h800["notes"] == []
    assert h800["recommend_flags"] == ["--hardware h800-sxm-80gb"]
    a800 = detect_node([(i, "NVIDIA A800-SXM4-80GB", 81920) for i in range(8)], None, [])
    assert a800["profile"] == "a800-sxm-80gb" and a800["profile_matched"] and a800["notes"] == []
    pcie = detect_node([(i, "NVIDIA A800 80GB PCIe", 81920) for i in range(8)], None, [])
    assert not pcie["profile_matched"] and "no shipped profile for NVIDIA A800 80GB PCIe" in pcie["notes"][0]


def test_the_variants_are_their_own_gpu_kinds():
    """launch and calibrate --from-run tell the variants from their twins and from their PCIe cards; the accuracy
    line says nothing was launched or published on them (the twins' runs are not theirs)."""
    from planner import accuracy
    from planner import launch as L
    from tests.runtime_helpers.plans import check_card_warnings
    assert [L.gpu_family(n) for n in ("NVIDIA H800", "NVIDIA H800 80GB HBM3", "h800-sxm-80gb", "NVIDIA H800 PCIe",
                                      "NVIDIA A800-SXM4-80GB", "a800-sxm-80gb", "NVIDIA A800 80GB PCIe",
                                      "NVIDIA A800-PCIE-40GB", "NVIDIA A100 80GB PCIe")] == \
        ["H800", "H800", "H800", "H800 PCIE", "A800", "A800", "A800 PCIE", "A800 PCIE", "A100 PCIE"]
    assert accuracy.gpu_kind("h800-sxm-80gb") == "h800" and accuracy.gpu_kind("a800-sxm-80gb") == "a800"
    assert accuracy.gpu_kind("h100-sxm-80gb") == "h100" and accuracy.gpu_kind("a100-sxm-80gb") == "a100"
    assert "none launched on h800-sxm-80gb" in accuracy.line("parplan", "h800-sxm-80gb")
    assert accuracy.line("megatron", "h800-sxm-80gb").startswith("how accurate: none published on H800; ")
    assert accuracy.line("megatron", "a800-sxm-80gb").startswith("how accurate: none published on A800; ")
    check_card_warnings("h800-sxm-80gb", "NVIDIA H800", ("NVIDIA H800 PCIe", "NVIDIA H100 80GB HBM3"))


def test_deepseek_v3_on_h800_reads_as_docs_accuracy_says():
    """docs/accuracy.md's plausibility check: DeepSeek-V3's published 2,664K H800 GPU hours for 14.8T tokens (1,543
    tokens/s/GPU) against the plan of its report's layout on this profile: the GPU work alone (compute, attention,
    FP8 casts) within 5 % of it, the whole step far under it (the all-to-all and bubble DualPipe overlaps, which no
    schedule parplan plans hides); the numbers the page quotes, to the token."""
    published = 14.8e12 / (2664e3 * 3600)
    spec = load_preset("deepseek-v3").model_copy(update={"mtp_layers": 1})
    rates = {}
    for dispatcher in ("alltoall", "deepep"):
        plan = recommend(spec, 2048, hardware="h800-sxm-80gb", framework="megatron", seq_len=4096,
                         global_batch_size=15360, pins=Pins(tp=1, pp=16, ep=64, cp=1, zero=1, recompute="none"),
                         suggest=False, top_k=1, fp8=True, mla_recompute=True, moe_dispatcher=dispatcher,
                         balance_head=True)  # the CLI's default split: [4 x 15, 1]
        pred = plan.prediction
        assert pred.fits and plan.parallel.dp == 128 and plan.parallel.stage_layers == [4] * 15 + [1]
        tb = pred.time_breakdown
        gpu_work = tb.compute_s + tb.attention_s + tb.fp8_cast_s
        rates[dispatcher] = (15360 * 4096 / gpu_work / 2048, pred.tokens_per_s / 2048)
    assert round(published) == 1543 and round(rates["alltoall"][0]) == 1489
    assert abs(rates["alltoall"][0] / published - 1) < 0.05
    assert (round(rates["alltoall"][1]), round(rates["deepep"][1])) == (847, 1043)
    text = " ".join((PROFILE_DIR.parent / "docs" / "accuracy.md").read_text(encoding="utf-8").split())
    assert "is 1,543 tokens/s/GPU" in text and "1,489 tokens/s/GPU, 3.5 % under it" in text
    assert "(847 tokens/s/GPU, −45 %; 29.46 s and 1,043 with DeepEP's dispatcher, −32 %)" in text
