"""Predicted vs published on the reference sets (planner/validate.py).

Bars on the two Megatron sets come from the accuracy issue; for the held-out sets we only assert what
honestly holds (every case is either predicted with a finite value or carries a reason), and the numbers
themselves live in benchmarks/results/accuracy.md (python benchmarks/accuracy_report.py)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from planner.validate import ADAPTERS, FITTED_ON, PLAUSIBILITY_ONLY, available_sets, reference_dir, summarize, validate_all, validate_set


@pytest.fixture(scope="module")
def cases():
    return validate_all()


@pytest.fixture(scope="module")
def summary(cases):
    return summarize(cases)


def test_every_reference_set_has_an_adapter():
    # a GEMM table, not a training run; GB200's three rows, one layout with two settings unpinned (README), no set
    files = {p.stem for p in reference_dir().glob("*.json")} - {"h100_gemm", "dgxc_gb200_bf16_405b"}
    assert files <= set(ADAPTERS), f"reference sets without an adapter: {sorted(files - set(ADAPTERS))}"
    assert set(available_sets()) == files


def test_sc21_table1_bars(summary):
    """Regression check of the fit: the profiles' one fitted parameter (sustained_matmul_fraction) was chosen
    on this set and the next (validate.FITTED_ON), so these bars hold partly by construction; the held-out
    sets' bars are the accuracy evidence."""
    s = summary["megatron_sc21_table1"]
    assert s["runs"] == 10 and s["missing"] == 0
    assert s["median_abs_error"] <= 0.07  # issue 4's bar for the public Megatron tables
    assert s["max_abs_error"] <= 0.20
    assert s["spearman"] >= 0.6


def test_megatron_h100_2024_bars(summary):
    """Regression check of the fit (see test_sc21_table1_bars)."""
    s = summary["megatron_h100_2024"]
    assert s["runs"] == 9 and s["missing"] == 0
    assert s["median_abs_error"] <= 0.07
    assert s["max_abs_error"] <= 0.20


def test_held_out_cases_are_predicted_or_explained(cases):
    for c in cases:
        if c.predicted is None:
            assert c.note.startswith("no feasible plan"), (c.set_name, c.label)
        else:
            assert math.isfinite(c.predicted) and c.predicted > 0, (c.set_name, c.label)
            assert math.isfinite(c.error)


def test_fully_specified_held_out_sets_predict_every_run(summary):
    # Every layout setting of these runs is published (or searched within the framework), so each
    # run must give a plan; llama3 (126 layers, interleaving not expressible) and the ZeRO-3 530B/640
    # estimate do not, and are reported as missing in accuracy.md.
    for name in ("korthikanti2022_selective_recompute", "bloom_176b", "opt_175b", "gpt_neox_20b", "mt_nlg_530b",
                 "megatron_sc21_table2_zero3"):
        assert summary[name]["missing"] == 0, name
    # SC21's 530B ZeRO-3 estimate on 640 GPUs fits since DeepSpeed holds two weights gathered and the
    # unfused backward's temporaries are replayed op by op (74.6 GB of 83.0 usable on 2026-11-23)
    assert summary["megatron_sc21_table2_zero3"]["runs"] == 12


def test_deepspeed_zero3_rows_follow_its_one_weight_prefetch(cases):
    """SC21 Table 2's ZeRO-3 rows, DeepSpeed's one-weight-ahead gathers modelled (cost_models/zero3.py):
    the 384-GPU row, where compute and communication balance, was +28.8 % with whole-block overlap and is
    +8.0 %; every ZeRO-3 row is within 15 %."""
    z3 = [c for c in cases if c.set_name == "megatron_sc21_table2_zero3" and c.label.startswith("zero3")]
    assert len(z3) == 6
    for c in z3:
        assert abs(c.error) < 0.15, (c.label, c.error)
    row384 = next(c for c in z3 if c.label == "zero3 174.6B 384gpu")
    assert abs(row384.error) < 0.10


def test_korthikanti_eq7_is_the_planner_model_flops(cases):
    # Korthikanti eq. 7 per token, 72 L h^2 (1 + s/(6h) + V/(12 h L)), equals the planner's model FLOPs
    # for GPT shapes, so its MFU is compared without conversion.
    c = next(c for c in cases if c.set_name == "korthikanti2022_selective_recompute" and c.plan is not None)
    m, s = c.plan.model, c.plan.training.seq_len
    eq7 = 72 * m.layers * m.hidden ** 2 * (1 + s / (6 * m.hidden) + m.vocab / (12 * m.hidden * m.layers))
    p = c.plan.prediction
    ours = p.model_tflops_per_gpu * 1e12 * c.plan.hardware.gpus / p.tokens_per_s
    assert ours == pytest.approx(eq7, rel=1e-9)


def test_sc21_eq3_metric_matches_hardware_flops_with_full_recompute(cases):
    c = next(c for c in cases if c.set_name == "megatron_sc21_table2_zero3" and c.plan is not None
             and c.plan.parallel.recompute == "full")
    assert c.predicted == pytest.approx(c.plan.prediction.hardware_tflops_per_gpu, rel=1e-9)


def test_cli_validate_json(capsys):
    from planner.cli import main
    rc = main(["validate", "--json", "--set", "megatron_sc21_table1", "--set", "bloom_176b"])
    assert not rc
    data = json.loads(capsys.readouterr().out)
    assert set(data["summary"]) == {"megatron_sc21_table1", "bloom_176b"}
    for s in data["summary"].values():
        assert {"runs", "missing", "median_abs_error", "max_abs_error", "spearman"} <= set(s)
    assert len(data["cases"]) == 13
    assert set(data["by_framework"]) == {"megatron", "deepspeed"}  # SC21 Table 1 is Megatron, BLOOM DeepSpeed
    assert data["by_framework"]["deepspeed"]["runs"] == 3
    assert all({"set", "run", "metric", "published", "predicted", "error"} <= set(c) for c in data["cases"])


def test_mt_nlg_published_tflops_follow_from_iteration_times():
    """The file's metric claim: SC21 eq. 3 over the published iteration time gives the published TFLOP/s,
    so `sc21_eq3_tflops` is the right conversion for this set."""
    d = json.loads((reference_dir() / "mt_nlg_530b.json").read_text())
    c = d["common"]
    s, L, h, V = c["seq_len"], c["layers"], c["hidden"], c["vocab"]
    for r in d["rows"]:
        flops = 96 * r["global_batch_size"] * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        assert flops / (r["gpus"] * r["iteration_time_s"]) / 1e12 == pytest.approx(r["tflops_per_gpu"], rel=0.01)
        assert r["dp"] * c["tp"] * c["pp"] == r["gpus"]


def test_mt_nlg_micro_batch_is_the_one_its_published_times_identify():
    """MT-NLG publishes no micro-batch; its three rows differ only in dp at one global batch, so the published
    iteration times split into 1F1B slots (m + pp - 1) and what runs outside the pipeline.  The file pins the
    micro-batch whose line leaves (nearly) nothing outside it, 2; at 1 the line needs 6 s an iteration, at 4 and
    more a negative time.  The published times alone decide it (no prediction enters pipeline_slot_fits)."""
    from planner.validate import pipeline_slot_fits
    d = json.loads((reference_dir() / "mt_nlg_530b.json").read_text())
    fits = pipeline_slot_fits(d)
    assert set(fits) == {1, 2, 4, 8, 16}  # the common divisors of the per-replica batches 240, 192, 160
    pinned = {r["micro_batch_size"] for r in d["rows"]}
    assert pinned == {min(fits, key=lambda b: abs(fits[b][1]))} == {2}
    assert all("micro_batch_size" in r["derived"] for r in d["rows"])
    assert fits[1][1] == pytest.approx(6.0, abs=0.1) and abs(fits[2][1]) < 1.0
    assert all(fits[b][1] < -10 for b in (4, 8, 16))
    # at 2 the line runs within 0.4 s of every published time
    slots = [r["global_batch_size"] // (r["dp"] * 2) + d["common"]["pp"] - 1 for r in d["rows"]]
    a, c0 = fits[2]
    assert max(abs(a * n + c0 - r["iteration_time_s"]) for n, r in zip(slots, d["rows"])) < 0.4
    # solved the other way (the README's check): with 0 to 1.06 s outside the pipeline the times put b at 1.9-1.7
    alpha, beta = a * d["rows"][0]["global_batch_size"] / 2, a * (d["common"]["pp"] - 1) + c0
    est = [(beta - outside) * d["rows"][0]["global_batch_size"] / ((d["common"]["pp"] - 1) * alpha)
           for outside in (0.0, 1.06)]
    assert est[0] == pytest.approx(1.89, abs=0.01) and est[1] == pytest.approx(1.74, abs=0.01)


def test_pipeline_sends_partitioned_for_megatron_and_deepspeed(cases):
    """Megatron sets send 1/tp slices between stages (scatter/gather), and so do the DeepSpeed pipeline
    sets (the engine's PartitionedTensor buffers whenever tp > 1); torchtitan's and llm-foundry's 1D FSDP
    runs have no pipeline to send over and keep parplan's default, whole tensors."""
    for c in cases:
        if c.plan is None:
            continue
        whole = c.set_name in ("torchtitan_2024_h100", "mpt_llm_foundry_h100", "mpt_llm_foundry_a100")
        assert c.plan.training.p2p_scatter_gather is (not whole), (c.set_name, c.label)
        # DeepSpeed's pipeline engine (BLOOM, MT-NLG, GPT-NeoX) is modelled as DeepSpeed: blocking transfers
        if c.set_name in ("bloom_176b", "gpt_neox_20b", "mt_nlg_530b"):
            assert c.plan.training.framework == "deepspeed", (c.set_name, c.label)


def test_reference_sets_ship_with_the_package():
    """pyproject maps the `parplan_reference` package onto benchmarks/reference, so an installed parplan
    (wheel or editable) finds the same files without a checkout (reference_dir's last fallback)."""
    from importlib.util import find_spec
    spec = find_spec("parplan_reference")
    assert spec is not None and spec.submodule_search_locations
    shipped = Path(list(spec.submodule_search_locations)[0])
    assert {p.name for p in shipped.glob("*.json")} == {p.name for p in reference_dir().glob("*.json")}
    # and the profiles a set's runs used (torchtitan's 500 W H100)
    assert {p.name for p in shipped.glob("profiles/*.toml")} == {p.name for p in reference_dir().glob("profiles/*.toml")}


@pytest.mark.parametrize("name", sorted(set(ADAPTERS) - set(FITTED_ON) - set(PLAUSIBILITY_ONLY)))
def test_other_published_sets_meet_the_12_percent_median_bar(summary, name):
    """Issue 4's bar for the other published sets: every held-out set, each on its own (MT-NLG since 2026-12-06,
    at the micro-batch its published times identify; OPT, GPT-NeoX and torchtitan are plausibility checks, the two
    sets a profile parameter is fitted on have the 7 % bar: README, "How accurate"); a regression fails here."""
    assert summary[name]["median_abs_error"] <= 0.12, summary[name]
    assert summary[name]["fitted"] is None  # no profile parameter fitted to them


def test_torchtitan_throughput_lies_between_its_two_peak_bounds(cases):
    """torchtitan's 500 W H100s have a peak "between SXM and NVL": the set's profile takes the SXM peak
    (an upper bound on tokens/s), the -nvl-peak profile the other end.  Every published tokens/s row is
    below its SXM prediction; the 16-bit ones within 6 % of their NVL one (+1.4 / +3.3 / -2.1 / -1.8 % on
    2026-12-04), the Float8 ones (predicted since 2026-12-04) above their NVL one (-4.0 and -10.4 %) and below
    or within 1 % of their SXM one (+7.6 and -0.6 %: since torchao's backward re-cast of each weight is counted,
    the twenty-first session, the 128-GPU row sits 0.6 % over its SXM bound, where the model charges FSDP's
    gathers at 16 bits and torchtitan may have gathered FP8 weights: the gathers are the model's upper bound)."""
    nvl = reference_dir() / "profiles" / "h100-hbm2e-96gb-500w-nvl-peak.toml"
    with open(reference_dir() / "torchtitan_2024_h100.json", encoding="utf-8") as f:
        low = {c.label: c for c in validate_set("torchtitan_2024_h100", json.load(f), str(nvl))
               if c.metric == "tokens_per_s_per_gpu"}
    high = {c.label: c for c in cases if c.set_name == "torchtitan_2024_h100" and c.metric == "tokens_per_s_per_gpu"}
    assert len(high) == len(low) == 6
    for label, c in high.items():
        if "Float8" in label:
            assert c.published < c.predicted * 1.01, label
            assert low[label].predicted < c.published, (label, low[label].error)
        else:
            assert c.published < c.predicted, label
            assert abs(low[label].error) < 0.06, (label, low[label].error)
        assert low[label].predicted < c.predicted


def test_validate_cli_takes_another_profile(capsys):
    from planner.cli import main
    assert main(["validate", "--set", "torchtitan_2024_h100", "--hardware", "no-such-gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown hardware profile" in err


def test_validate_on_a_profile_that_cannot_time_the_sets_kernel_says_why(capsys):
    """The MPT sets' Triton kernel needs FlashAttention-2's published speed on the GPU; predicted on a profile
    without it every run is missing, each with the planner's reason, and the summary line says so."""
    from planner.cli import main
    assert main(["validate", "--set", "mpt_llm_foundry_h100", "--hardware", "h200-sxm-141gb"]) == 0
    out = capsys.readouterr().out
    assert "flash_attention_2_tflops" in out and "mpt_llm_foundry_h100: 0 runs, no prediction" in out


def test_validate_on_a_profile_without_a_sets_dtype_says_so_up_front(capsys, tmp_path):
    """A profile without fp16's peak predicts none of MT-NLG's fp16 runs: one note on stderr before the tables names
    the sets left out and why, and each set's summary line carries the reason; the bf16 set is predicted."""
    from planner.cli import main
    src = (Path(__file__).resolve().parents[1] / "hardware_profiles" / "h100-sxm-80gb.toml").read_text(encoding="utf-8")
    line = next(x for x in src.splitlines() if x.startswith("peak_dense_tflops"))
    (tmp_path / "no-fp16.toml").write_text(src.replace(line, "peak_dense_tflops = { bf16 = 989.4, fp32 = 66.9 }"))
    argv = ["validate", "--set", "mt_nlg_530b", "--set", "megatron_h100_2024", "--hardware", str(tmp_path / "no-fp16.toml")]
    assert main(argv) == 0
    got = capsys.readouterr()
    note = [x for x in got.err.splitlines() if x.startswith("note: ")]
    assert len(note) == 1 and "1 set not predicted (mt_nlg_530b)" in note[0] and "fp16" in note[0], got.err
    assert "mt_nlg_530b: 0 runs, no prediction (no feasible plan: hardware profile" in got.out
    assert "megatron_h100_2024: 9 runs, median" in got.out


def test_a_set_partly_predicted_says_how_many_runs_were_left_out(capsys):
    """On the A100 40GB, 8 of SC21 Table 1's 10 runs fit no layout: the set's line says so beside its errors (it had
    read "2 runs, median 3.6 %" as if the set were 2 runs)."""
    from planner.cli import main
    assert main(["validate", "--set", "megatron_sc21_table1", "--hardware", "a100-sxm-40gb"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("megatron_sc21_table1: "))
    assert line.startswith("megatron_sc21_table1: 2 runs, median") and line.endswith("(8 of 10 not predicted: see the table)")


def test_torchtitan_nvl_profile_differs_from_its_sxm_one_only_in_the_peak():
    """The lower-bound profile is a copy with another peak; any other field drifting apart would make the
    two bounds answer different questions."""
    import hardware_profiles
    d = reference_dir() / "profiles"
    sxm = hardware_profiles.load_profile(str(d / "h100-hbm2e-96gb-500w.toml")).model_dump()
    nvl = hardware_profiles.load_profile(str(d / "h100-hbm2e-96gb-500w-nvl-peak.toml")).model_dump()
    differ = {k for k in sxm if sxm[k] != nvl[k]}
    assert differ <= {"name", "peak_dense_tflops"} and "peak_dense_tflops" in differ, differ


def test_committed_accuracy_page_regenerates(cases, summary):
    """benchmarks/results/accuracy.md, per set and per run, is what validate gives today (its date aside):
    rerun `python benchmarks/accuracy_report.py` after changing the cost model."""
    import re
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import accuracy_report
    finally:
        sys.path.pop(0)
    committed = (accuracy_report.OUT).read_text(encoding="utf-8")
    date = re.search(r"^Generated (\S+) by", committed, re.M).group(1)
    assert committed == accuracy_report.render_markdown(cases, summary, date) + "\n"


def test_shipped_accuracy_summary_matches_the_cost_model(cases):
    """planner/data/accuracy.json (the 'how accurate' line under a plan) is what validate gives today:
    rerun `python benchmarks/accuracy_report.py` after changing the cost model."""
    from planner.accuracy import PATH
    from planner.validate import framework_summary
    shipped = json.loads(PATH.read_text(encoding="utf-8"))["published"]
    assert shipped == framework_summary(cases, digits=4)


def test_plan_json_carries_its_accuracy():
    """Programs reading --json get the same numbers: Prediction.accuracy, by the plan's framework."""
    from planner.core import evaluate_plan, recommend
    from planner.models import load_preset
    spec = load_preset("tiny-llama-test")
    shipped = json.loads((Path(__file__).resolve().parents[1] / "planner" / "data" / "accuracy.json").read_text())
    meg = recommend(spec, 2, seq_len=64, global_batch_size=4, suggest=False, framework="megatron")
    acc, on_h100 = meg.prediction.accuracy  # every published run of the framework, then those on the plan's GPU kind
    assert acc.runs == shipped["published"]["megatron"]["runs"] and "published" in acc.basis
    assert on_h100.runs == shipped["published"]["megatron"]["by_gpu"]["h100"]["runs"] and "on H100" in on_h100.basis
    own = evaluate_plan(recommend(spec, 2, seq_len=64, global_batch_size=4, suggest=False))
    assert [a.runs for a in own.prediction.accuracy] == [shipped["h100_launches"]["runs"]] * 2


def test_the_accuracy_line_names_the_published_runs_on_the_plans_gpu_kind():
    """Published sets span GPU kinds (Megatron's: SC21 on A100, Megatron-Core and NeMo on H100): a plan's line leads
    with the runs on its own kind, and says where none was published on it (DeepSpeed's sets are all A100)."""
    from planner.accuracy import line
    shipped = json.loads((Path(__file__).resolve().parents[1] / "planner" / "data" / "accuracy.json").read_text())
    by_gpu = shipped["published"]["megatron"]["by_gpu"]
    assert set(by_gpu) == {"a100", "h100"} and sum(g["runs"] for g in by_gpu.values()) == 153
    h100 = line("megatron", "h100-sxm-80gb")
    assert h100.startswith(f"how accurate: {by_gpu['h100']['runs']} published runs on H100, |error| median ")
    assert "(all 153 on A100, H100: median" in h100
    assert line("deepspeed", "h100-sxm-80gb").startswith("how accurate: none published on H100; 12 published runs on A100")
    assert line("deepspeed", "a100-sxm-40gb").startswith("how accurate: 12 published runs on A100, |error| median")
    assert line("megatron", "b200").startswith("how accurate: none published on B200; 153 published runs on A100, H100")
    for name, kind in (("gb300-nvl72", "GB300"), ("b300", "B300"), ("mi355x", "MI355X"), ("mi325x", "MI325X"),
                       ("l40s", "L40S"), ("h800-sxm-80gb", "H800"), ("a800-sxm-80gb", "A800"),
                       ("h100-nvl-94gb", "H100-NVL"), ("h20-96gb", "H20"), ("gh200-96gb", "GH200")):
        assert line("megatron", name).startswith(f"how accurate: none published on {kind}; 153 published runs on A100")
    assert line("megatron", "my-node.toml").startswith("how accurate: 153 published runs on A100, H100")


def test_recommend_says_how_accurate(capsys):
    from planner.cli import main
    assert main(["recommend", "--model", "tiny-llama-test", "--gpus", "2", "--top", "1", "--framework", "megatron"]) == 0
    out, err = capsys.readouterr()  # the table and its accuracy line are stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("how accurate:"))
    assert "published runs" in line and "median" in line


README_ROWS = {  # the README's "How accurate" table: the start of a row's first cell -> its set
    "Megatron SC21 Table 1": "megatron_sc21_table1",
    "Megatron-Core H100 2024": "megatron_h100_2024",
    "Korthikanti 2022": "korthikanti2022_selective_recompute",
    "SC21 Table 2": "megatron_sc21_table2_zero3",
    "BLOOM-176B": "bloom_176b",
    "Llama 3 405B": "llama3_405b_table4",
    "MT-NLG 530B": "mt_nlg_530b",
    "llm-foundry MPT (H100": "mpt_llm_foundry_h100",
    "llm-foundry MPT (A100": "mpt_llm_foundry_a100",
    "NVIDIA DGX Cloud NeMo benchmarks in FP8": "nemo_h100_fp8",  # before its BF16 set's prefix, which it starts with
    "NVIDIA DGX Cloud NeMo": "nemo_h100_bf16",
    "NeMo Megatron Launcher GPT-3": "nemo_launcher_gpt3",
    "DeepSeek-V3 under Megatron-Core": "megatron_deepseek_h100",
    "gpt-oss-120b under Megatron-Core": "megatron_gpt_oss_h100",
}


def test_readme_accuracy_table_matches_validate(summary):
    """The README's per-set median and max are what `parplan validate` computes today, to 0.1 point: a
    cost-model change that moves a published set cannot leave the README's numbers behind."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    seen = set()
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = next((s for prefix, s in README_ROWS.items() if cells[0].startswith(prefix)), None)
        if name is None or len(cells) < 5:
            continue
        median, worst = (float(c.rstrip(" %")) / 100 for c in cells[3:5])
        assert median == pytest.approx(summary[name]["median_abs_error"], abs=5e-4), (name, cells)
        assert worst == pytest.approx(summary[name]["max_abs_error"], abs=5e-4), (name, cells)
        seen.add(name)
    assert seen == set(README_ROWS.values())


@pytest.mark.parametrize("name,rows", [("mpt_llm_foundry_h100", 52), ("mpt_llm_foundry_a100", 139)])
def test_mpt_shapes_reproduce_every_published_parameter_count(name, rows):
    """The llm-foundry MPT sets' shapes (their yamls) and parplan's gpt count give every row's NumParams
    to the parameter, learned positions of the row's sequence length included."""
    import json as _json

    from cost_models.params import param_counts
    from planner.validate import ADAPTERS, reference_dir
    data = _json.loads((reference_dir() / f"{name}.json").read_text())
    queries = list(ADAPTERS[name](data))
    assert len(queries) == len(data["rows"]) == rows
    assert len({q.label for q in queries}) == rows
    for q, r in zip(queries, data["rows"]):
        assert param_counts(q.spec, r["seq_len"])["total"] == r["num_params"], q.label


def test_mpt_a100_rows_take_their_gpu_and_their_fsdp_mixed_precision():
    """Each A100 row runs on its table's GPU (80 GB or 40 GB profile) with the gradient reduction its MP Mode
    column says: DEFAULT reduces in fp32 (master-weights), PURE in bf16 (master-weights-half-grads)."""
    import json as _json

    from planner.validate import mpt_llm_foundry_a100, reference_dir
    data = _json.loads((reference_dir() / "mpt_llm_foundry_a100.json").read_text())
    seen = set()
    for q, r in zip(mpt_llm_foundry_a100(data), data["rows"]):
        assert q.hardware == {"a100_80gb": "a100-sxm-80gb", "a100_40gb": "a100-sxm-40gb"}[r["gpu"]]
        assert q.precision == {"DEFAULT": "master-weights", "PURE": "master-weights-half-grads"}[r["mp_mode"]]
        assert q.attention_kernel == "triton-2022"
        seen.add((q.hardware, q.precision))
    assert len(seen) == 3  # 80 GB rows of both modes, 40 GB rows PURE


def test_only_the_mpt_set_times_the_triton_kernel_and_its_plans_replay_it(cases):
    """llm-foundry's runs used the Triton FlashAttention of 2022 (attn_impl triton); every other set's stack ran
    FlashAttention-2 or newer, the profile's measured curve.  A plan carries the kernel, so evaluating it again
    gives the same prediction, and the same plan timed with the profile's curve is faster by the attention alone."""
    from planner.core import evaluate_plan
    for c in cases:
        if c.plan is not None:
            want = "triton-2022" if c.set_name.startswith("mpt_llm_foundry") else "profile"
            assert c.plan.training.attention_kernel == want, (c.set_name, c.label)
    mpt = next(c for c in cases if c.set_name == "mpt_llm_foundry_h100" and c.label == "7b s32768 8gpu")
    again = evaluate_plan(mpt.plan)
    assert again.prediction.step_time_s == pytest.approx(mpt.plan.prediction.step_time_s, rel=1e-9)
    faster = evaluate_plan(mpt.plan.model_copy(update={"training": mpt.plan.training.model_copy(
        update={"attention_kernel": "profile"})}))
    assert faster.prediction.step_time_s < 0.8 * mpt.plan.prediction.step_time_s


def test_every_mpt_run_fits_with_flash_attns_16bit_loss_gradient(cases):
    """Every llm-foundry run gives a plan.  Four A100 40GB runs (350M, micro-batch 18, 16-128 GPUs) fit only
    because the loss is counted as flash-attn's cross-entropy, whose gradient is 16-bit (cross_entropy_16bit_grad):
    with Megatron's fp32 softmax (2 B a logit more, 3.7 GB at their 36,864 tokens) they needed 40.5 GB of 40.3."""
    import dataclasses as _dc

    from planner.validate import mpt_llm_foundry_a100, reference_dir, run_query
    assert not [c.label for c in cases if c.set_name.startswith("mpt_llm_foundry") and c.predicted is None]
    data = __import__("json").loads((reference_dir() / "mpt_llm_foundry_a100.json").read_text())
    q = next(q for q in mpt_llm_foundry_a100(data) if q.label == "350m s2048 64gpu 40gb")
    assert q.cross_entropy_16bit_grad and run_query(q) is not None
    assert run_query(_dc.replace(q, cross_entropy_16bit_grad=False)) is None


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(rows=[]), "no rows to predict"),
    (lambda d: d["rows"][0].update(tflops_per_gpu=0), "row '1.7B': its published"),
    (lambda d: d["rows"][0].update(tflops_per_gpu=None), "not a positive number"),
    (lambda d: d["rows"][0].update(gpus=0), "row '1.7B': gpus must be a positive integer, got 0"),
])
def test_a_hand_edited_reference_file_is_named_in_one_line(capsys, tmp_path, edit, says):
    """A reference folder whose set has no rows, a zero or missing published figure, or a row no plan can be built
    from is the file's fault, said in one line with exit 2 (each had been an internal error: a KeyError, a
    ZeroDivisionError, a TypeError, a pydantic error blaming a plan the user never gave)."""
    from planner.cli import main
    data = json.loads((reference_dir() / "megatron_sc21_table1.json").read_text())
    edit(data)
    (tmp_path / "megatron_sc21_table1.json").write_text(json.dumps(data))
    assert main(["validate", "--reference-dir", str(tmp_path), "--json"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and len(got.err.strip().splitlines()) == 1 and says in got.err, got.err
    assert "reference set" in got.err and "internal error" not in got.err


def _nemo_rows():
    return json.loads((reference_dir() / "nemo_h100_bf16.json").read_text())


def _nemo_flops_per_seq(r: dict, c: dict) -> float:
    """The READMEs' model FLOPs per sequence: s (12 L h^2 (1 + g/a + s/h) + 18 L F h + 6 V h), with their own g
    (16 for 405B) and V (128256 for every size)."""
    sh, s, L = c["shapes"][r["model"]], r["seq_len"], r["layers"]
    h, a, F = sh["hidden"], sh["heads"], sh["ffn_hidden"]
    g = 16 if r["model"] == "llama3.1-405b" else sh["kv_heads"]
    return s * (12 * L * h * h * (1 + g / a + s / h) + 18 * L * F * h + 6 * 128256 * h)


def test_nemo_h100_bf16_published_numbers_are_consistent():
    """Every row's printed tokens/s is seq x GBS over the printed step time, its MFU is the README's FLOP formula
    over that time against 989 TFLOP/s (one row's tokens/s and MFU are its neighbour's: its row_note), the compared
    tokens/s per GPU is the step time's, dp x tp x pp x cp is the GPU count, and the micro-batches fill the batch."""
    d = _nemo_rows()
    c = d["common"]
    assert len(d["rows"]) == 46
    for r in d["rows"]:
        label = (r["release"], r["model"], r["gpus"])
        tps = r["seq_len"] * r["global_batch_size"] / r["step_time_s"]
        assert r["tokens_per_s_per_gpu"] == pytest.approx(tps / r["gpus"], abs=0.01), label
        step = r["step_time_s"]
        if label == ("24.09", "llama3.1-70b", 2048):  # its tokens/s and MFU are the 1024-GPU column's (row_note)
            assert "1024-GPU column" in r["row_note"] and tps == pytest.approx(r["tokens_per_s"], rel=5e-3)
            step = 14.92
        assert r["seq_len"] * r["global_batch_size"] / step == pytest.approx(r["tokens_per_s"], rel=1e-3), label
        mfu = r["global_batch_size"] * _nemo_flops_per_seq(r, c) / step / r["gpus"] / 989e12
        assert mfu * 100 == pytest.approx(r["mfu_percent"], rel=6e-3), label
        assert r["dp"] * r["tp"] * r["pp"] * r["cp"] == r["gpus"], label
        assert r["global_batch_size"] % (r["dp"] * r["micro_batch_size"]) == 0, label
        assert {"dp", "tokens_per_s_per_gpu"} <= set(r["derived"]), label


def test_nemo_h100_bf16_flop_formula_is_the_planner_model_flops(cases):
    """With the shape the README's formula counts (the 70B rows: 8 kv heads, vocab 128256) the published FLOPs per
    sequence are parplan's model FLOPs (6 x matmul params + 12 L h s per token), so the file's MFU is parplan's."""
    from planner.validate import _model_flops_per_token
    d = _nemo_rows()
    r = next(r for r in d["rows"] if r["model"] == "llama3.1-70b")
    c = next(c for c in cases if c.set_name == "nemo_h100_bf16" and c.label == f"{r['release']} 70b {r['gpus']}gpu")
    assert _model_flops_per_token(c.plan) * r["seq_len"] == pytest.approx(_nemo_flops_per_seq(r, d["common"]), rel=1e-9)


def test_nemo_h100_bf16_adapter_pins_what_the_file_says():
    """One pin variant per row, every layout setting the README states: tp, pp, cp, dp, micro-batch, virtual stages
    (interleaved 1F1B, or 1F1B without), the distributed optimizer (ZeRO 1), no recompute, SP with tp, no offload; the
    configs' stack flags (overlaps, no dropout, TP-comm overlap only with tp > 1); the Launcher's 405B shape."""
    from planner.validate import nemo_h100_bf16
    d = _nemo_rows()
    queries = list(nemo_h100_bf16(d))
    assert len(queries) == len(d["rows"]) and len({q.label for q in queries}) == len(queries)
    for q, r in zip(queries, d["rows"]):
        (p,) = q.pin_variants
        vp = r["vp"] or 1
        assert (p.tp, p.pp, p.cp, p.dp, p.mbs, p.vpp) == (r["tp"], r["pp"], r["cp"], r["dp"], r["micro_batch_size"], vp)
        assert p.schedule == ("interleaved-1f1b" if vp > 1 else "1f1b")
        assert (p.zero, p.recompute, p.sp, p.offload) == (1, "none", r["tp"] > 1, "none")
        assert q.overlap_tp_comm is (r["tp"] > 1) and q.overlap_grad_reduce and q.overlap_param_gather
        assert not q.dropout and q.dtype == "bf16" and q.hardware == "h100-sxm-80gb" and q.framework == "megatron"
        assert q.metric == "tokens_per_s_per_gpu" and q.published == r["tokens_per_s_per_gpu"]
        assert q.spec.layers == r["layers"] and q.global_batch_size == r["global_batch_size"]
        launcher_405b = r["model"] == "llama3.1-405b" and r["release"] != "nemo2"
        assert (q.spec.kv_heads, q.spec.vocab) == ((16, 51200) if launcher_405b else (8, 128256)), q.label


def test_nemo_h100_bf16_is_held_out_and_under_predicted(summary, cases):
    """Held out (nothing fitted to it) and within the held-out bar; every predicted row is under the published
    throughput (9.5 % median on 2026-12-03: the runs sustain more of the GEMM curve than the fraction fitted on the
    Megatron-Core 2024 table); the one row without a plan is NeMo 2.0's 405B on 512 GPUs, over memory with fp32
    gradients (the recipe's gradient dtype is not published)."""
    s = summary["nemo_h100_bf16"]
    assert s["fitted"] is None and s["plausibility_only"] is None
    assert s["runs"] == 45 and s["missing"] == 1
    assert s["median_abs_error"] <= 0.12
    mine = [c for c in cases if c.set_name == "nemo_h100_bf16"]
    assert all(c.error < 0 for c in mine if c.predicted is not None)
    (missing,) = [c for c in mine if c.predicted is None]
    assert missing.label == "nemo2 405b 512gpu" and "GB/GPU" in missing.note


def _launcher_rows():
    return json.loads((reference_dir() / "nemo_launcher_gpt3.json").read_text())


def _gpt3_flops_per_seq(L: int, h: int, s: int = 2048, V: int = 51200) -> float:
    """dgxc's README formula: s (24 L h^2 + 12 L h s + 48 L h^2 + 6 V h) per sequence (2.20e15 for 175B)."""
    return s * (24 * L * h * h + 12 * L * h * s + 48 * L * h * h + 6 * V * h)


def test_nemo_launcher_gpt3_published_numbers_are_consistent():
    """Every A100 row's tokens/s per GPU is its printed aggregate over 8 GPUs a node; every H100 row's printed
    tokens/s is seq x GBS over its step time, its MFU the README's 2.20e15 FLOPs per sequence (its formula, rounded) over that time against
    989 TFLOP/s, its days to train 1T tokens 1e12 over its tokens/s, and dp x tp x pp its GPUs; the 5B convergence
    run's 300B tokens at 726,384 tokens/s take the printed 4.8 days."""
    d = _launcher_rows()
    assert len(d["rows"]) == 31
    assert _gpt3_flops_per_seq(96, 12288) == pytest.approx(2.20e15, rel=3e-3)
    for r in d["rows"]:
        label = (r["table"], r["model"], r["gpus"])
        assert r["gpus"] == 8 * r["nodes"], label
        if not r["table"].startswith("dgxc"):
            assert r["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / r["gpus"], abs=0.01), label
            continue
        tps = 2048 * r["global_batch_size"] / r["step_time_s"]
        assert tps == pytest.approx(r["tokens_per_s"], rel=1e-3), label
        assert r["tokens_per_s_per_gpu"] == pytest.approx(tps / r["gpus"], abs=0.01), label
        mfu = r["global_batch_size"] * 2.20e15 / r["step_time_s"] / r["gpus"] / 989e12  # the README's rounded FLOPs
        assert mfu * 100 == pytest.approx(r["mfu_percent"], rel=2e-3), label
        assert round(1e12 / r["tokens_per_s"] / 86400) == r["days_to_train_1t_tokens"], label
        assert r["dp"] * r["tp"] * r["pp"] == r["gpus"] and r["global_batch_size"] == 16 * r["nodes"], label
    run = d["convergence_run"]
    assert run["tokens"] / run["tokens_per_s"] / 86400 == pytest.approx(run["time_to_train_days"], abs=0.05)


def test_nemo_launcher_gpt3_flop_formula_is_the_planner_model_flops(cases):
    """dgxc's FLOPs per sequence (vocab 51,200) are parplan's model FLOPs for GPT-3 175B with that vocab (the
    Launcher 23.x 175B rows, whose tp is unknown, take it), so its MFU is parplan's."""
    from planner.validate import _model_flops_per_token
    c = next(c for c in cases if c.label == "launcher-23.x 175b 64gpu")
    assert c.plan.model.vocab == 51200
    assert _model_flops_per_token(c.plan) * 2048 == pytest.approx(_gpt3_flops_per_seq(96, 12288), rel=1e-9)


def test_nemo_launcher_gpt3_adapter_pins_what_the_file_says():
    """H100 rows: one variant, every published setting (tp 4, pp 8, vp 12, mbs 1, dp, no recompute, SP, ZeRO 1) and
    the recipe's stack (TP-comm overlap, TE attention, bf16 gradient sync).  A100 rows: the tp / pp the README's text
    states, the optimizer it names (22.08 Adam: ZeRO 0; 23.x Distributed Adam: ZeRO 1), softmax attention; the 23.x
    175B layout searched over tp 4 / pp 8, tp 8 / pp 8 and tp 8 / pp 16 where they divide the GPUs.  The shape is the
    gpt arch with a tied embedding, vocab padded for the row's tp."""
    from planner.validate import nemo_launcher_gpt3, nemo_padded_vocab
    assert [nemo_padded_vocab(tp) for tp in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    d = _launcher_rows()
    queries = list(nemo_launcher_gpt3(d))
    assert len(queries) == len(d["rows"]) and len({q.label for q in queries}) == len(queries)
    for q, r in zip(queries, d["rows"]):
        assert q.spec.arch == "gpt" and q.spec.tied_embeddings and q.spec.ffn_hidden == 4 * q.spec.hidden
        assert q.spec.vocab == (nemo_padded_vocab(r["tp"]) if r["tp"] else 51200), q.label
        assert q.dtype == "bf16" and q.dropout and q.metric == "tokens_per_s_per_gpu"
        assert q.published == r["tokens_per_s_per_gpu"]
        if r["table"].startswith("dgxc"):
            (p,) = q.pin_variants
            assert (p.tp, p.pp, p.dp, p.mbs, p.vpp, p.zero, p.recompute, p.sp) == (4, 8, r["dp"], 1, 12, 1, "none", True)
            assert q.hardware == "h100-sxm-80gb" and q.overlap_tp_comm and q.flash_attention
            assert q.precision == "master-weights-half-grads" and q.global_batch_size == r["global_batch_size"]
            continue
        assert q.hardware == "a100-sxm-80gb" and not q.flash_attention and not q.overlap_tp_comm
        zero = 1 if r["table"] == "launcher-23.x" else 0
        assert {p.zero for p in q.pin_variants} == {zero}, q.label
        layouts = {(p.tp, p.pp) for p in q.pin_variants}
        if r["tp"]:
            assert layouts == {(r["tp"], r["pp"])}, q.label
        else:
            assert layouts == {lay for lay in ((4, 8), (8, 8), (8, 16)) if r["gpus"] % (lay[0] * lay[1]) == 0}, q.label
        assert q.overlap_grad_reduce is (r["table"] == "launcher-23.x" or r["pp"] == 1), q.label
        # the batch: the row's where published, else the number global_batch_size_used gives with its reason
        used = d["global_batch_size_used"][f"{r['model']} {r['table']}"]
        assert q.global_batch_size == (r["global_batch_size"] or int(used.split(":")[0])), q.label


def test_nemo_launcher_gpt3_is_held_out(summary, cases):
    """Held out: the A100 fraction was fitted on SC21 Table 1, the H100 one on the Megatron-Core 2024 table.  Measured
    2026-12-03: 31 runs, median 10.7 %, max 48.0 %.  The BigNLP 22.08 rows within 6.4 %, the Launcher 23.x 5B rows
    within 10.7 %, the H100 BF16 rows all under-predicted (11-18 %), the Launcher 23.x 175B rows over-predicted by
    38-48 %: their published speed is that of full recompute without SP (see the next test)."""
    s = summary["nemo_launcher_gpt3"]
    assert s["fitted"] is None and s["plausibility_only"] is None
    assert s["runs"] == 31 and s["missing"] == 0 and s["median_abs_error"] <= 0.12
    mine = {c.label: c for c in cases if c.set_name == "nemo_launcher_gpt3"}
    for label, c in mine.items():
        if label.startswith("dgxc"):
            assert -0.19 < c.error < 0, label
        elif label.startswith("launcher-23.x 175b"):
            assert 0.25 < c.error < 0.5, label
        else:
            assert abs(c.error) < 0.12, label


def test_nemo_launcher_gpt3_23x_175b_reads_as_full_recompute():
    """Why the Launcher 23.x 175B rows err: pinned to tp 8 / pp 8 with full recompute and no SP (the 2021 Megatron
    recipe), the 64- and 1024-GPU rows come within 3 % (the search picks selective recompute with SP, 38-48 % faster
    than published).  Not used for the set's numbers: the README does not say so."""
    import dataclasses

    from planner.search import Pins
    from planner.validate import metric_value, nemo_launcher_gpt3, run_query
    for q in nemo_launcher_gpt3(_launcher_rows()):
        if q.label not in ("launcher-23.x 175b 64gpu", "launcher-23.x 175b 1024gpu"):
            continue
        full = dataclasses.replace(q, pin_variants=[Pins(tp=8, pp=8, cp=1, vpp=1, zero=1, sp=False, offload="none",
                                                         schedule="1f1b", recompute="full")])
        plan = run_query(full)
        assert abs(metric_value(plan, full) / q.published - 1) < 0.03, q.label
