"""CLI commands end to end: the recommend --json contract, real shell pipes into export and evaluate,
explain/compare/sweep smoke tests, --version and schema."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main

REC = ["recommend", "--model", "llama3-8b", "--gpus", "16", "--json"]

CONTRACT = {
    "schema_version": None,
    "model": ["num_params"],
    "hardware": ["name", "gpus", "gpus_per_node"],
    "training": ["seq_len", "global_batch_size", "micro_batch_size", "num_microbatches", "dtype"],
    "parallel": ["tp", "pp", "dp", "cp", "vpp", "sp", "zero_stage", "recompute", "schedule", "offload"],
    "prediction": ["memory_bytes_per_gpu", "step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                   "hardware_tflops_per_gpu", "mfu", "hfu", "bubble_fraction", "comm_bytes_per_step", "amdahl",
                   "fits", "reason"],
    "search": ["candidates", "feasible", "seconds"],
    "alternatives": None,
}


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


@pytest.fixture(scope="module")
def plan_text():
    from io import StringIO
    from contextlib import redirect_stdout, redirect_stderr
    buf = StringIO()
    with redirect_stdout(buf), redirect_stderr(StringIO()):
        assert main(REC) == 0
    return buf.getvalue()


@pytest.fixture()
def plan_file(plan_text, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(plan_text)
    return str(p)


def test_recommend_json_contract(plan_text):
    d = json.loads(plan_text)
    for key, sub in CONTRACT.items():
        assert key in d, key
        for s in sub or []:
            assert s in d[key], f"{key}.{s}"
    pr = d["prediction"]
    assert set(pr["memory_bytes_per_gpu"]) >= {"weights", "grads", "optimizer", "activations", "other", "total"}
    assert set(pr["comm_bytes_per_step"]) >= {"tp", "pp", "dp", "cp"}
    assert set(pr["amdahl"]) >= {"parallel_fraction", "speedup"}
    assert d["schema_version"] == 1 and d["hardware"]["gpus"] == 16 and pr["fits"] is True and pr["reason"] is None
    p = d["parallel"]
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == 16
    assert isinstance(d["alternatives"], list) and d["alternatives"]
    assert d["model"]["num_params"] > 7e9


def _parplan_cmd() -> str:
    exe = shutil.which("parplan")
    return exe if exe else f"{sys.executable} -m planner.cli"


def _pipe(second: str) -> subprocess.CompletedProcess:
    exe = _parplan_cmd()
    cmd = f"set -o pipefail; {exe} recommend --model llama3-8b --gpus 16 --json | {exe} {second}"
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)


def test_shell_pipe_into_export(plan_text):
    r = _pipe("export - --to torchtitan")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    from hardware_profiles import tomllib  # tomli on Python 3.10
    toml = tomllib.loads(r.stdout)  # the whole export parses, notes being comments
    assert toml["parallelism"]["tensor_parallel_degree"] == json.loads(plan_text)["parallel"]["tp"]


def test_shell_pipe_into_llm_foundry_export_notes_the_framework_on_stderr(plan_text):
    """A parplan plan exported to llm-foundry: the YAML alone on stdout (its notes are comments), and a note on stderr
    that the prediction modelled parplan's runtime, not fsdp (what --framework fsdp would change)."""
    r = _pipe("export - --to llm-foundry")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "models parplan, not fsdp" in r.stderr
    body = [x for x in r.stdout.splitlines() if x and not x.startswith("#")]
    assert body[0] == f"max_seq_len: {json.loads(plan_text)['training']['seq_len']}"
    assert "fsdp_config:" in body and all(":" in x for x in body)


def test_shell_pipe_into_evaluate_gives_same_prediction(plan_text):
    r = _pipe("evaluate - --json")
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout)["prediction"]
    first = json.loads(plan_text)["prediction"]
    for k in ("step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction"):
        assert again[k] == pytest.approx(first[k], rel=1e-9), k
    for k, v in first["memory_bytes_per_gpu"].items():
        if v is None or isinstance(v, str):  # by_stage without a pipeline; peak_moment
            assert again["memory_bytes_per_gpu"][k] == v, k
        else:
            assert again["memory_bytes_per_gpu"][k] == pytest.approx(v, rel=1e-9), k
    assert again["fits"] is True


def test_shell_pipe_closed_early_is_quiet():
    """`parplan recommend --json | head -c 10`: the JSON (about 160 KB at --top 40) is more than a pipe holds,
    so parplan is still writing when head has gone; it ends with 0 and says nothing (parplan's own exit
    status, not head's)."""
    exe = _parplan_cmd()
    cmd = f"{exe} recommend --model llama3-8b --gpus 8 --json --top 40 | head -c 10; exit ${{PIPESTATUS[0]}}"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    assert r.stdout == '{\n  "schem'
    big = subprocess.run(["bash", "-c", f"{exe} recommend --model llama3-8b --gpus 8 --json --top 40 | wc -c"],
                         capture_output=True, text=True, timeout=60)
    assert int(big.stdout) > 2**16  # larger than a pipe's buffer: the writer meets the closed pipe


def test_explain_json_and_text(plan_file, capsys):
    rc, out, err = _run(["explain", plan_file, "--json"], capsys)
    assert rc == 0 and err == ""
    d = json.loads(out)
    assert d["fits"] is True
    assert set(d["memory"]["parts_bytes"]) == {"weights", "grads", "optimizer", "activations", "other"}
    assert d["memory"]["usable_bytes"] > d["memory"]["total_bytes"]
    assert set(d["time"]["parts_s"]) == {"compute", "tp_comm", "pp_comm", "dp_comm", "cp_comm", "ep_comm", "bubble", "optimizer"}
    assert d["time"]["dominant"] in d["time"]["parts_s"]
    # the parts and what they leave out (the table's "other" row) make the step
    assert sum(d["time"]["parts_s"].values()) + d["time"]["remainder_s"] == pytest.approx(d["time"]["step_time_s"],
                                                                                          rel=1e-9)
    # each part is the plan's own prediction of it, and the remainder (embedding, head, casts) a small share
    pa = json.loads(open(plan_file).read())["prediction"]
    for part, value in d["time"]["parts_s"].items():
        assert value == pytest.approx(pa["time_breakdown"][f"{part}_s"], rel=1e-9, abs=1e-12), part
    assert d["time"]["step_time_s"] == pytest.approx(pa["step_time_s"], rel=1e-9)
    assert abs(d["time"]["remainder_s"]) <= 0.03 * pa["step_time_s"]
    ru = d["runner_up"]
    assert ru is not None and ru["changes"], "runner-up must differ from the plan"
    # the runner-up against this plan, signs included (the plan file's own prediction is the base)
    assert ru["relative_step_time"] == pytest.approx(ru["step_time_s"] / pa["step_time_s"] - 1)
    assert ru["delta_step_time_s"] == pytest.approx(ru["step_time_s"] - pa["step_time_s"])
    assert ru["delta_memory_bytes"] == pytest.approx(ru["memory_total_bytes"] - pa["memory_bytes_per_gpu"]["total"])
    rc, out, err = _run(["explain", plan_file], capsys)
    assert rc == 0 and err == "" and "runner-up" in out and "dominates" in out


def test_explain_without_alternatives_searches_runner_up(plan_file, tmp_path, capsys):
    d = json.loads(open(plan_file).read())
    d["alternatives"] = []
    p = tmp_path / "bare.json"
    p.write_text(json.dumps(d))
    rc, out, _ = _run(["explain", str(p), "--json"], capsys)
    assert rc == 0
    assert json.loads(out)["runner_up"]["changes"]


def test_explain_of_a_plan_edited_off_the_best_names_the_faster_layout(plan_file, tmp_path, capsys):
    """A hand-edited plan keeps its file's alternatives, ranked against the layout it was edited from; one of them
    faster than the plan had been shown as its "runner-up".  explain searches again and calls it what it is."""
    d = json.loads(open(plan_file).read())
    d["parallel"]["zero_stage"] = 3
    p = tmp_path / "edited.json"
    p.write_text(json.dumps(d))
    rc, out, _ = _run(["explain", str(p), "--json"], capsys)
    ru = json.loads(out)["runner_up"]
    assert rc == 0 and ru["relative_step_time"] < 0
    rc, out, _ = _run(["explain", str(p)], capsys)
    assert rc == 0 and "a faster layout (" in out and "runner-up (" not in out


def test_compare_same_rows_and_relative(plan_file, tmp_path, capsys):
    d = json.loads(open(plan_file).read())
    alt = dict(d["alternatives"][0])
    b = tmp_path / "b.json"
    b.write_text(json.dumps(alt))
    rc, out, _ = _run(["compare", plan_file, str(b), "--json"], capsys)
    assert rc == 0
    rows = json.loads(out)["rows"]
    names = [r["name"] for r in rows]
    assert {"step_time_s", "tokens_per_s", "mfu", "memory_total_bytes", "tp", "pp", "dp"} <= set(names)
    by = {r["name"]: r for r in rows}
    step_a, step_b = d["prediction"]["step_time_s"], alt["prediction"]["step_time_s"]
    assert step_a != pytest.approx(step_b)  # so a swapped A and B would show
    assert (by["step_time_s"]["a"], by["step_time_s"]["b"]) == (pytest.approx(step_a), pytest.approx(step_b))
    assert by["step_time_s"]["relative"] == pytest.approx(step_b / step_a - 1)
    assert by["tp"]["a"] == d["parallel"]["tp"] and by["tp"]["b"] == alt["parallel"]["tp"]
    same = {r["name"]: r for r in json.loads((_run(["compare", plan_file, plan_file, "--json"], capsys))[1])["rows"]}
    assert [r["name"] for r in same.values()] == names
    assert same["step_time_s"]["relative"] == pytest.approx(0.0)
    # a term neither plan has (0 in both) did not change: 0, not null
    zero_both = [r for r in same.values() if r["a"] == 0 and not isinstance(r["a"], bool)]
    assert zero_both and all(r["relative"] == 0.0 for r in zero_both), zero_both
    rc, out, err = _run(["compare", plan_file, str(b)], capsys)
    assert rc == 0 and err == "" and "B vs A" in out


def test_sweep_json_and_chart(capsys):
    base = ["sweep", "--model", "llama3-8b", "--gpus-list", "8,16,64"]
    rc, out, _ = _run(base + ["--json"], capsys)
    assert rc == 0
    rows = json.loads(out)
    assert [r["gpus"] for r in rows] == [8, 16, 64]
    for r in rows:
        assert r["fits"] and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["memory_total_bytes"] > 0
    assert rows[-1]["tokens_per_s"] > rows[0]["tokens_per_s"]
    rc, out, err = _run(base, capsys)
    assert rc == 0 and err == "" and "tokens/s" in out and "MFU" in out and "#" in out
    assert "FP8" not in out
    rc, out, err = _run(base + ["--fp8"], capsys)  # says so, and against which peak its MFU is
    assert rc == 0 and "linears in FP8" in out and "MFU (against the 16-bit peak; the linears run in FP8)" in out


def test_sweep_nothing_fits_exit_3(capsys):
    rc, out, err = _run(["sweep", "--model", "llama3-405b", "--gpus-list", "1,2", "--json"], capsys)
    assert rc == 3
    rows = json.loads(out)
    assert [r["gpus"] for r in rows] == [1, 2] and all(not r["fits"] and r["reason"] for r in rows)


def test_sweep_shares_recommend_options(capsys):
    rc, out, _ = _run(["sweep", "--params", "7e9", "--tp", "2", "--seq-len", "2048", "--gpus-list", "16", "--json"],
                      capsys)
    assert rc == 0 and json.loads(out)[0]["layout"]["tp"] == 2


def test_version(capsys):
    rc, out, _ = _run(["--version"], capsys)
    assert rc == 0 and out.startswith("parplan ")


def test_schema_parses(capsys):
    rc, out, _ = _run(["schema"], capsys)
    assert rc == 0
    s = json.loads(out)
    root = s["$defs"][s["$ref"].rsplit("/", 1)[1]] if "$ref" in s else s
    assert {"model", "hardware", "training", "parallel", "prediction"} <= set(root["properties"])


def test_recommend_table_goes_to_stdout_and_notes_to_stderr(capsys):
    """The answer for people is stdout (`> plan.txt`, `| less`); a note is stderr; --json is only JSON."""
    rc, out, err = _run(["recommend", "--params", "7e9", "--gpus", "8"], capsys)
    assert rc == 0 and "layouts" in out and "note: derived from" in err and "layouts" not in err
    rc, out, err = _run(["recommend", "--params", "7e9", "--gpus", "8", "--json"], capsys)
    assert rc == 0 and json.loads(out)["parallel"] and "layouts" not in out + err
    for argv in (["validate", "--set", "bloom_176b"], ["models", "list"], ["hardware", "list"]):
        rc, out, err = _run(argv, capsys)
        assert rc == 0 and out.strip() and err == "", argv


def test_a_table_piped_into_launch_says_to_add_json(capsys, monkeypatch):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("top 5 layouts for 8 x h100-sxm-80gb\n"))
    rc, out, err = _run(["evaluate", "-"], capsys)
    assert rc == 2 and out == "" and "add --json" in err


def test_help_lists_new_commands(capsys):
    rc, out, _ = _run(["--help"], capsys)
    assert rc == 0
    for c in ("explain", "compare", "sweep", "recommend"):
        assert c in out


def test_stage_layers_print_as_runs():
    from planner.render import compact_counts
    assert compact_counts([0] + [1] * 126 + [0]) == "[0, 1 x126, 0]"
    assert compact_counts([32]) == "[32]"
    assert compact_counts([5, 6, 6, 5]) == "[5, 6 x2, 5]"
    assert compact_counts([]) == "[]"


def test_model_config_approximations_are_a_note_on_stderr(tmp_path, capsys):
    """A config whose mapping approximates (gemma2 past its sliding window) says so on stderr; stdout stays
    the JSON plan, and a config that maps exactly adds no note."""
    cfg = {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 256000,
           "sliding_window": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, out, err = _run(["recommend", "--model-config", str(path), "--gpus", "8", "--seq-len", "8192", "--json"], capsys)
    assert rc == 0 and json.loads(out)["model"]["arch"] == "llama"
    assert "note: " in err and "counted as full attention at seq_len 8192" in err
    exact = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256}
    path.write_text(json.dumps(exact))
    rc, out, err = _run(["recommend", "--model-config", str(path), "--gpus", "8", "--json"], capsys)
    assert rc == 0 and "note: Hugging Face" not in err


def test_a_defaulted_batch_of_many_tokens_gets_a_note(capsys):
    """1024 sequences is 4M tokens at 4096 but 134M at 128K: a defaulted batch past 16M tokens says so
    on stderr; an explicit one, or a default within it, adds nothing."""
    rc, out, err = _run(["recommend", "--model", "tiny-llama-test", "--gpus", "8", "--seq-len", "32768", "--json"], capsys)
    assert rc == 0 and json.loads(out)["training"]["global_batch_size"] == 1024
    assert "note: the global batch defaults to 1024 sequences, 34M tokens" in err
    for extra in (["--seq-len", "32768", "--global-batch-size", "1024"], ["--seq-len", "4096"]):
        rc, out, err = _run(["recommend", "--model", "tiny-llama-test", "--gpus", "8", "--json"] + extra, capsys)
        assert rc == 0 and "global batch" not in err, extra


def test_explicit_shape_takes_head_dim_and_tied_embeddings(capsys):
    """Qwen3-32B by flags (head_dim 128 > hidden / heads = 80) is the preset, to the parameter; the
    embedding flags override the arch's default (llama untied)."""
    flags = ["recommend", "--layers", "64", "--hidden", "5120", "--heads", "64", "--kv-heads", "8", "--ffn-hidden",
             "25600", "--vocab", "151936", "--gpus", "64", "--json"]
    rc, out, _ = _run(flags + ["--head-dim", "128"], capsys)
    assert rc == 0
    model = json.loads(out)["model"]
    from planner.models import load_preset
    assert model["head_dim"] == 128 and model["num_params"] == load_preset("qwen3-32b").num_params
    rc, out, _ = _run(flags + ["--head-dim", "128", "--tied-embeddings"], capsys)
    tied = json.loads(out)["model"]
    assert rc == 0 and tied["tied_embeddings"] and model["num_params"] - tied["num_params"] == 151936 * 5120


def test_a_gpt_models_learned_positions_cap_the_sequence(capsys):
    """GPT-2's table has 1024 positions: the default sequence is that, with a note; a longer --seq-len is one
    line with the fix (the run would crash on the position add; launch's pre-flight says so too)."""
    rc, out, err = _run(["recommend", "--model", "gpt2", "--gpus", "1", "--json"], capsys)
    assert rc == 0 and json.loads(out)["training"]["seq_len"] == 1024 and "1024 learned positions" in err
    rc, out, err = _run(["recommend", "--model", "gpt2", "--gpus", "1", "--seq-len", "2048"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--seq-len 1024 or less" in err
    rc, out, _ = _run(["recommend", "--model", "llama3-8b", "--gpus", "8", "--json"], capsys)
    assert json.loads(out)["training"]["seq_len"] == 4096  # no learned table: the default


def test_a_rotary_configs_context_is_the_default_sequence(capsys):
    """A config's context below the default 4096 (GPT-NeoX-20B's 2048, rotary) is the default sequence, with a
    note (it had been planned at 4096, past the checkpoint's context); --seq-len still goes past it, noted."""
    cfg = str(Path(__file__).parent / "data" / "hf_configs" / "gpt-neox-20b.json")
    rc, out, err = _run(["recommend", "--model-config", cfg, "--gpus", "8", "--json"], capsys)
    assert rc == 0 and json.loads(out)["training"]["seq_len"] == 2048 and "context, 2048 tokens" in err
    rc, out, err = _run(["recommend", "--model-config", cfg, "--gpus", "8", "--seq-len", "4096", "--json"], capsys)
    assert rc == 0 and json.loads(out)["training"]["seq_len"] == 4096 and "context extension" in err
    import os  # a config through a pipe (--model-config <(...)) is read once: a second read had found it empty
    r, w = os.pipe()
    os.write(w, Path(cfg).read_bytes())
    os.close(w)
    try:
        rc, out, err = _run(["recommend", "--model-config", f"/dev/fd/{r}", "--gpus", "8", "--json"], capsys)
    finally:
        os.close(r)
    assert rc == 0 and json.loads(out)["training"]["seq_len"] == 2048, err


def test_pipeline_schedules_need_a_pipeline(capsys):
    """Without a pipeline every schedule is plain gradient accumulation: pp 1 is searched as 1F1B only, a pinned
    schedule with --pp 1 is refused, and a hand-written pp-1 GPipe plan is predicted as 1F1B (one micro-batch's
    activations, not all of them)."""
    rc, _, err = _run(["recommend", "--model", "llama3-8b", "--gpus", "8", "--schedule", "zbv", "--pp", "1"], capsys)
    assert rc == 2 and "nothing to schedule" in err
    rc, out, _ = _run(["recommend", "--model", "llama3-8b", "--gpus", "8", "--schedule", "gpipe",
                       "--global-batch-size", "16", "--json"], capsys)
    plan = json.loads(out)
    assert rc == 0 and plan["parallel"]["pp"] > 1 and plan["parallel"]["schedule"] == "gpipe"
    from planner.core import evaluate_plan, recommend
    from planner.models import load_preset
    from planner.search import Pins
    one = recommend(load_preset("llama3-8b"), 8, pins=Pins(pp=1), global_batch_size=64, suggest=False)
    assert one.parallel.schedule == "1f1b" and one.training.num_microbatches > 1
    gpipe = one.model_copy(deep=True)
    gpipe.parallel.schedule = "gpipe"
    a, b = evaluate_plan(one).prediction, evaluate_plan(gpipe).prediction
    assert a.memory_bytes_per_gpu.total == b.memory_bytes_per_gpu.total and a.step_time_s == b.step_time_s


def test_a_partly_used_node_gets_a_note(capsys):
    rc, out, err = _run(["recommend", "--model", "llama3-8b", "--gpus", "8", "--gpus-per-node", "3", "--json"], capsys)
    assert rc == 0 and json.loads(out) and "2 full node(s) and one with 2 of its 3" in err
    _, _, err = _run(["recommend", "--model", "llama3-8b", "--gpus", "16", "--gpus-per-node", "8", "--json"], capsys)
    assert "full node" not in err


def test_sweep_input_errors_and_tokens(capsys):
    """A bad profile, or a pin no count can take, is bad input (exit 2, one line), not 'nothing fits'; --tokens
    adds days and GPU-hours to every row."""
    rc, out, err = _run(["sweep", "--model", "llama2-7b", "--hardware", "nope", "--json"], capsys)
    assert rc == 2 and out == "" and "unknown hardware profile" in err
    rc, out, err = _run(["sweep", "--model", "llama2-7b", "--gpus-list", "8,16", "--tp", "3", "--json"], capsys)
    assert rc == 2 and out == "" and "no GPU count in --gpus-list can be planned" in err
    # each count's own reason, in sweep's words (it has no --gpus)
    rc, out, err = _run(["sweep", "--model", "llama2-7b", "--gpus-list", "4,12", "--tp", "8"], capsys)
    assert rc == 2 and "--tp 8 does not divide 4 GPUs; --tp 8 does not divide 12 GPUs" in err and "--gpus 4" not in err
    rc, out, _ = _run(["sweep", "--model", "llama2-7b", "--gpus-list", "8,16", "--tokens", "1T", "--json"], capsys)
    rows = json.loads(out)
    assert rc == 0 and all(r["days_to_train"] > 0 and r["gpu_hours_to_train"] > 0 for r in rows)
    rc, out, _ = _run(["sweep", "--model", "llama2-7b", "--gpus-list", "8", "--tokens", "1T"], capsys)
    assert "GPU-hours" in out
    # a count the pins rule out is skipped, not "does not fit" (which is memory's), and the count is not the fix
    rc, out, _ = _run(["sweep", "--model", "llama3-8b", "--gpus-list", "8,12", "--tp", "8"], capsys)
    assert rc == 0 and "skipped: --tp 8 does not divide 12 GPUs " in out and "pick a divisor" not in out
    assert "does not fit" not in out and "    12 | (skipped)" in out


def test_validate_reads_a_set_once_and_says_which_profile(capsys):
    rc, out, _ = _run(["validate", "--set", "bloom_176b", "--set", "bloom_176b", "--json"], capsys)
    data = json.loads(out)
    assert rc == 0 and data["summary"]["bloom_176b"]["runs"] == 3 and len(data["cases"]) == 3
    assert data["hardware"] == "each set's own profile"
    rc, out, _ = _run(["validate", "--set", "megatron_h100_2024", "--hardware", "a100-sxm-80gb", "--json"], capsys)
    data = json.loads(out)
    assert data["hardware"] == "a100-sxm-80gb" and data["summary"]["megatron_h100_2024"]["fitted"] is None
    fw = data["by_framework"]["megatron"]  # as computed, like the set's (not rounded to 4 digits first)
    assert fw["median_abs_error"] == data["summary"]["megatron_h100_2024"]["median_abs_error"]


def test_a_broken_reference_file_is_one_line(tmp_path, capsys):
    import shutil as sh
    from planner.validate import reference_dir
    for f in reference_dir().glob("*.json"):
        sh.copy(f, tmp_path / f.name)
    (tmp_path / "bloom_176b.json").write_text("{bad")
    rc, out, err = _run(["validate", "--reference-dir", str(tmp_path), "--set", "bloom_176b"], capsys)
    assert rc == 2 and "cannot read it as JSON" in err and err.count("\n") == 1
    data = json.loads((reference_dir() / "bloom_176b.json").read_text())
    del data["rows"][0]["heads"]
    (tmp_path / "bloom_176b.json").write_text(json.dumps(data))
    rc, out, err = _run(["validate", "--reference-dir", str(tmp_path), "--set", "bloom_176b"], capsys)
    assert rc == 2 and "missing key 'heads'" in err
    # a top level or rows of the wrong JSON type: said in JSON's words, not a Python exception's
    for text, said in (("[1]", "the top level must be a JSON object"), ('{"rows": "x"}', "its rows must be a JSON list")):
        (tmp_path / "bloom_176b.json").write_text(text)
        rc, out, err = _run(["validate", "--reference-dir", str(tmp_path), "--set", "bloom_176b"], capsys)
        assert rc == 2 and said in err and "TypeError" not in err and err.count("\n") == 1, err
    # a folder with no set file named as an adapter: says so, not "pass --reference-dir" (which was passed)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.json").write_text("{}")
    rc, out, err = _run(["validate", "--reference-dir", str(empty)], capsys)
    assert rc == 2 and "holds no known set file" in err and "bloom_176b" in err


def test_compare_names_the_plan_and_notes_different_jobs(tmp_path, capsys):
    _, a, _ = _run(["recommend", "--model", "tiny-llama-test", "--gpus", "2", "--seq-len", "64",
                    "--global-batch-size", "4", "--json"], capsys)
    _, b, _ = _run(["recommend", "--model", "llama2-7b", "--gpus", "8", "--json"], capsys)
    (tmp_path / "a.json").write_text(a)
    (tmp_path / "b.json").write_text(b)
    (tmp_path / "bad.json").write_text('{"x": 1}')
    rc, out, err = _run(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"], capsys)
    assert rc == 0 and json.loads(out) and "differ in model" in err and "seq_len (64 vs 4096)" in err
    rc, _, err = _run(["compare", str(tmp_path / "a.json"), str(tmp_path / "bad.json")], capsys)
    assert rc == 2 and err.startswith(f"error: plan B ({tmp_path / 'bad.json'})")
    # the same preset name and batch, another size (--params) or another machine: said too
    for name, argv, said in (("p7", ["--params", "7e9"], None), ("p13", ["--params", "13e9"], "hidden (4096 vs 5120)"),
                             ("a100", ["--params", "7e9", "--hardware", "a100-sxm-80gb", "--pool-nics"],
                              "hardware (h100-sxm-80gb vs a100-sxm-80gb), NIC pooling (off vs on)"),
                             ("off", ["--params", "7e9", "--one-nic-per-rank"], None)):  # the profile's off, said
        _, text, _ = _run(["recommend", *argv, "--gpus", "8", "--json"], capsys)
        (tmp_path / f"{name}.json").write_text(text)
        rc, _, err = _run(["compare", str(tmp_path / "p7.json"), str(tmp_path / f"{name}.json")], capsys)
        assert rc == 0 and (said in err if said else "differ" not in err), (name, err)
    # a vocabulary 8 apart (the same size to 0.01 B): the field itself is named
    d = json.loads((tmp_path / "p7.json").read_text())
    d["model"]["vocab"] += 8
    (tmp_path / "p7v.json").write_text(json.dumps(d))
    rc, _, err = _run(["compare", str(tmp_path / "p7.json"), str(tmp_path / "p7v.json")], capsys)
    assert rc == 0 and f"vocab ({d['model']['vocab'] - 8} vs {d['model']['vocab']})" in err, err


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`parplan validate | head -1`: rich's broken-pipe handler exited 1; the command now ends with 0."""
    cmd = f"{sys.executable} -m planner.cli validate --set bloom_176b | true; exit ${{PIPESTATUS[0]}}"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_hardware_and_models_take_json(capsys):
    import hardware_profiles
    rc, out, _ = _run(["hardware", "list", "--json"], capsys)
    assert rc == 0 and [p["name"] for p in json.loads(out)] == hardware_profiles.list_profiles()
    for argv in (["hardware", "show", "h100-sxm-80gb", "--json"], ["models", "show", "gpt2", "--json"]):
        rc, out, _ = _run(argv, capsys)
        assert rc == 0 and json.loads(out)["name"]


def test_an_unknown_gpu_is_told_how_to_make_its_profile_and_that_recipe_works(capsys, tmp_path):
    """An unshipped GPU (--hardware rtx-6000-ada): the error says how to write a profile for it, and that recipe works: a
    shipped profile's `hardware show` JSON, edited, is a profile --hardware reads (the plan records the file)."""
    base = ["recommend", "--model", "llama3-8b", "--gpus", "8", "--json"]
    rc, out, err = _run(base + ["--hardware", "rtx-6000-ada"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "unknown hardware profile 'rtx-6000-ada'" in err and "parplan hardware show h100-sxm-80gb > my-gpu.json" in err
    rc, out, _ = _run(["hardware", "show", "h100-sxm-80gb"], capsys)
    prof = json.loads(out)
    prof.update(name="my-gpu", hbm_gbytes=48.0)  # an edit: a smaller card
    (tmp_path / "my-gpu.json").write_text(json.dumps(prof))
    rc, out, _ = _run(base + ["--hardware", str(tmp_path / "my-gpu.json")], capsys)
    plan = json.loads(out)
    usable = plan["prediction"]["usable_memory_bytes"]
    assert rc == 0 and plan["hardware"]["name"] == str(tmp_path / "my-gpu.json") and usable == pytest.approx((48.0 - prof["memory_reserve_gbytes"]) * 1e9)
    rc, out, _ = _run(base + ["--hardware", "h100-sxm-80gb"], capsys)
    assert json.loads(out)["prediction"]["usable_memory_bytes"] > usable


def test_stack_flag_help_names_each_frameworks_default():
    """Where a flag's help says "Default: the framework's (on for ...)", those are the frameworks whose prediction
    turns it on (planner.core.FRAMEWORK_DEFAULTS over Training's own defaults): the help had said "off, as
    parplan's runtime" for four flags parplan had since turned on."""
    import re

    from planner.cli import _MODEL_OPTIONS
    from planner.core import FRAMEWORK_DEFAULTS
    from planner.schema import Training
    checked = 0
    for name, _, _, _, help_text in _MODEL_OPTIONS:
        m = re.search(r"Default: the framework's \(on for ([^)]*)\)", help_text)
        if not m:
            continue
        said = set(re.split(r", | and ", m.group(1)))
        on = {fw for fw, d in FRAMEWORK_DEFAULTS.items() if d.get(name, Training.model_fields[name].default) is True}
        assert said == on, (name, said, on)
        checked += 1
    assert checked >= 4


def test_sweep_where_nothing_fits_says_why_at_each_count(capsys):
    """A count short of memory wants more GPUs; one where every layout breaks a rule (3 GPUs: the default batch
    does not split) does not: the error had told both to try larger counts."""
    rc, out, err = _run(["sweep", "--model", "llama3-8b", "--framework", "torchtitan", "--gpus-list", "1,3", "--json"],
                        capsys)
    assert rc == 3 and json.loads(out)
    assert "at 1 memory runs out: try larger counts" in err and "at 3 every layout breaks a rule" in err


def test_a_plan_finds_its_relative_profile_file_from_elsewhere(tmp_path, monkeypatch, capsys):
    """`recommend --hardware mine.toml` records the path as typed (relative to where it ran, as the committed
    launch reports do); a plan read from another folder looks for it beside the plan file and in the folders above
    (the path had failed anywhere but where recommend ran)."""
    import hardware_profiles
    src = Path(hardware_profiles.__file__).parent / "h100-sxm-80gb.toml"
    (tmp_path / "mine.toml").write_bytes(src.read_bytes())
    (tmp_path / "runs" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    rc, out, _ = _run(["recommend", "--model", "tiny-llama-test", "--gpus", "2", "--seq-len", "128",
                       "--global-batch-size", "8", "--hardware", "mine.toml", "--json"], capsys)
    assert rc == 0 and json.loads(out)["hardware"]["name"] == "mine.toml"
    (tmp_path / "runs" / "a" / "plan.json").write_text(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rc, out2, err = _run(["evaluate", str(tmp_path / "runs" / "a" / "plan.json"), "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out2)["prediction"]["step_time_s"] == pytest.approx(json.loads(out)["prediction"]["step_time_s"])


def test_explain_of_a_plan_as_recommended_calls_its_alternative_the_runner_up(tmp_path, capsys):
    """The search ranks a simpler layout first among those within 5 % of the fastest, so a plan as recommended can
    have a slightly faster first alternative: that is its runner-up, not "a faster layout" (a label for more than
    the near tie, or a plan edited off its search)."""
    rc, out, _ = _run(["recommend", "--model", "llama3-70b", "--gpus", "128", "--framework", "megatron", "--json"],
                      capsys)
    p = tmp_path / "p.json"
    p.write_text(out)
    rc, out, _ = _run(["explain", str(p), "--json"], capsys)
    ru = json.loads(out)["runner_up"]
    assert rc == 0 and ru["relative_step_time"] > -0.05
    assert any(line.startswith("runner-up (") for line in json.loads(out)["summary"])


def test_explain_names_a_fitting_layout_and_prints_the_plans_warnings(tmp_path, capsys):
    """A hand-edited plan that does not fit, whose other layout does: the summary calls that one "a layout that fits"
    (it had read "runner-up", as if the plan were the better of the two); and the plan's own warnings (an edited
    stage split) print with the explanation and sit in its JSON, as `evaluate` gives them (explain had left them
    out; the edited split, which carried a warning until the thirty-eighth session predicted it as written, is now
    beside an uncalibrated profile's warning).  The faster-layout threshold is the search's near tie seen from the other side: other / plan - 1 below
    -NEAR_TIE / (1 + NEAR_TIE)."""
    from planner.core import recommend
    from planner.explain import runner_label
    from planner.models import load_preset
    from planner.search import NEAR_TIE, Pins
    edge = -NEAR_TIE / (1 + NEAR_TIE)
    assert runner_label({"relative_step_time": edge * 1.01}) == "a faster layout"
    assert runner_label({"relative_step_time": edge * 0.99}) == "runner-up"
    assert runner_label({"relative_step_time": 0.1, "fits": True}, plan_fits=False) == "a layout that fits"
    plan = recommend(load_preset("llama3-8b"), 8, pins=Pins(tp=1, pp=1, dp=8, zero=3))
    d = json.loads(plan.model_dump_json())
    d["parallel"]["zero_stage"] = 0  # 8B replicated with its optimizer: about 150 GB a GPU
    p = tmp_path / "big.json"
    p.write_text(json.dumps(d))
    rc, out, _ = _run(["explain", str(p)], capsys)
    assert rc == 3 and "a layout that fits (" in out and "runner-up (" not in out
    plan = recommend(load_preset("llama3-8b"), 8, hardware="l40s", pins=Pins(tp=2, pp=4, dp=1, vpp=1, schedule="1f1b"))
    d = json.loads(plan.model_dump_json())
    d["parallel"]["stage_layers"] = [7, 9, 8, 8]
    p.write_text(json.dumps(d))
    rc, out, _ = _run(["evaluate", str(p), "--json"], capsys)
    warned = json.loads(out)["prediction"]["warnings"]
    assert any(w.startswith("uncalibrated: l40s") for w in warned)
    rc, out, _ = _run(["explain", str(p), "--json"], capsys)
    assert json.loads(out)["warnings"] == warned
    rc, out, _ = _run(["explain", str(p)], capsys)
    assert rc == 0 and all(f"warning: {w}" in " ".join(out.split()) for w in warned)


def test_schema_takes_json_and_plans_keep_the_flags_network_floor(tmp_path, capsys):
    """`schema --json` as `models show --json` (it had said "No such option"); a plan's inter-node bandwidth has the
    flag's floor, 0.001 GB/s (1e-300 had printed a 300-digit step time)."""
    rc, out, _ = _run(["schema", "--json"], capsys)
    assert rc == 0 and "Plan" in json.loads(out)["$defs"]
    from planner.core import recommend
    from planner.models import load_preset
    d = json.loads(recommend(load_preset("llama3-8b"), 16).model_dump_json())
    d["hardware"]["inter_node_gbytes_per_s"] = 1e-300
    p = tmp_path / "slow.json"
    p.write_text(json.dumps(d))
    rc, out, err = _run(["explain", str(p)], capsys)
    assert rc == 2 and out == "" and "inter_node_gbytes_per_s" in err and len(err.strip().splitlines()) == 1


def test_sweep_names_what_sets_a_layout_apart(capsys):
    """The sweep's one layout column names offload, ZeRO, SP, virtual stages and recompute where a plan has them:
    llama3-70b's best plan on 8 GPUs offloads its optimizer, which the column had left out."""
    rc, out, _ = _run(["sweep", "--model", "llama3-70b", "--gpus-list", "16", "--offload", "optimizer", "--zero", "1",
                       "--recompute", "full", "--vpp", "2", "--json"], capsys)
    assert rc == 0
    row = json.loads(out)[0]
    lay = row["layout"]
    want = (f"tp{lay['tp']} pp{lay['pp']} dp{lay['dp']} vpp2" + (" sp" if lay["sp"] else "")
            + " zero1 full offload")
    assert row["layout_label"] == want


def test_fp16_under_the_fp32_recipe_gets_a_note(capsys):
    """--dtype names the 16-bit recipes' dtype; the fp32 recipe computes in fp32 (core.compute_dtype), so the flag
    changes nothing there, and recommend says so on stderr (the JSON on stdout is the same plan)."""
    args = ["recommend", "--model", "llama3.2-1b", "--gpus", "8", "--precision", "fp32", "--json"]
    rc, out, err = _run(args + ["--dtype", "fp16"], capsys)
    assert rc == 0 and "--dtype fp16 applies only to the 16-bit recipes" in err
    plan = json.loads(out)
    _, bf16_out, bf16_err = _run(args, capsys)
    assert "--dtype" not in bf16_err
    assert json.loads(bf16_out)["prediction"] == plan["prediction"]
    _, _, amp_err = _run(["recommend", "--model", "llama3.2-1b", "--gpus", "8", "--dtype", "fp16", "--json"], capsys)
    assert "--dtype" not in amp_err


def test_full_attention_past_the_last_layer_gets_a_note(capsys):
    """Every k-th layer attends in full (ModelSpec.windowed_layers); k past the layer count leaves none that does,
    the same model as no --full-attention-every at all, which recommend says on stderr."""
    shape = ["recommend", "--layers", "8", "--hidden", "1024", "--heads", "8", "--sliding-window", "512",
             "--seq-len", "2048", "--gpus", "8", "--framework", "megatron", "--json"]
    rc, out, err = _run(shape + ["--full-attention-every", "9"], capsys)
    assert rc == 0 and "--full-attention-every 9 is past the model's 8 layers" in err
    _, plain, _ = _run(shape, capsys)
    assert json.loads(out)["prediction"] == json.loads(plain)["prediction"]
    _, _, err = _run(shape + ["--full-attention-every", "8"], capsys)  # the last layer attends in full
    assert "past the model" not in err


def test_min_gpus_says_what_it_tried_under_pins(capsys):
    """The stderr line names the counts searched: with pins whose product does not divide a node, their multiples."""
    rc, out, err = _run(["recommend", "--model", "llama3-70b", "--objective", "min-gpus", "--gpus", "64", "--tp", "8",
                         "--pp", "3", "--json"], capsys)
    assert rc == 0 and json.loads(out)["hardware"]["gpus"] == 24
    assert "fewest GPUs that fit: 24 (tried every multiple of 24, the pinned degrees' product, up to --gpus 64)" in err
    rc, out, err = _run(["recommend", "--model", "llama3-70b", "--objective", "min-gpus", "--gpus", "16", "--tp", "8",
                         "--pp", "3", "--json"], capsys)
    assert rc == 2 and out == "" and "raise --gpus to 24 or more" in err


def test_nothing_fits_says_its_first_suggestion_once(capsys):
    """The error line carries the first suggestion; the suggestion lines above it hold the others only."""
    rc, out, err = _run(["recommend", "--model", "llama3-405b", "--gpus", "8"], capsys)
    first = err.strip().splitlines()[-1]
    assert rc == 3 and first.startswith("error: nothing fits") and "--gpus 32 fits" in first
    assert err.count("--gpus 32 fits") == 1


def _edited(plan_text, tmp_path, name, edit):
    d = json.loads(plan_text)
    edit(d)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)


def test_a_plan_that_leaves_out_a_field_recommend_sets_otherwise_says_what_it_read(plan_text, tmp_path, capsys):
    """The schema's defaults are what plans from before a field meant (amp, unfused...), not what recommend writes: a
    plan without training.precision had gone from fitting to 'does not fit' with nothing said (a helper's audit)."""
    def drop(d):
        del d["training"]["precision"], d["training"]["clip_grad"]
    rc, out, err = _run(["evaluate", _edited(plan_text, tmp_path, "p.json", drop), "--json"], capsys)
    assert "has no training.precision, training.clip_grad: read as precision amp, clip_grad None" in err
    assert json.loads(out)["training"]["precision"] == "amp"
    def seed(d):
        del d["training"]["seed"]  # its default is recommend's: nothing to say
    rc, out, err = _run(["evaluate", _edited(plan_text, tmp_path, "q.json", seed), "--json"], capsys)
    assert rc == 0 and "note: the plan" not in err


def test_plans_recommend_would_refuse_are_refused_by_every_command(tmp_path, capsys):
    """A sequence past a learned position table (export had written --max-position-embeddings 4096 for gpt2) and a
    16-bit recipe at dtype fp32 (timed at the fp32 peak, weights counted at 2 bytes) are one-line errors, exit 2."""
    rc, text, _ = _run(["recommend", "--model", "gpt2", "--gpus", "1", "--json"], capsys)
    def longer(d):
        d["training"]["seq_len"] = 4096
    def fp32(d):
        d["training"]["dtype"] = "fp32"
    for edit, said in ((longer, "seq_len(4096) is beyond the model's 1024 learned positions"),
                       (fp32, "dtype fp32 with precision master-weights")):
        path = _edited(text, tmp_path, "p.json", edit)
        for cmd in (["evaluate", path], ["explain", path], ["export", path, "--to", "megatron"]):
            rc, out, err = _run(cmd, capsys)
            assert rc == 2 and said in err and not out, (cmd, err)


def test_brackets_in_file_and_profile_names_are_not_rich_markup(plan_text, tmp_path, capsys, monkeypatch):
    """A plan under `[old]/` had lost its folder in compare's header, and a `[/x]` in a path crashed compare and
    recommend --hardware with rich's MarkupError."""
    monkeypatch.chdir(tmp_path)  # short relative paths: the header shows them whole
    a, b = Path("[old]"), Path("exp[/x]")
    a.mkdir()
    b.mkdir(parents=True)  # exp[ / x]
    (a / "plan.json").write_text(plan_text)
    (b / "plan.json").write_text(plan_text)
    rc, out, err = _run(["compare", str(a / "plan.json"), str(b / "plan.json")], capsys)
    assert rc == 0 and "[old]/plan.json" in out and "exp[/x]/plan.json" in out, out
    profile = b / "h.toml"
    shutil.copy(Path(__file__).resolve().parents[1] / "hardware_profiles" / "h100-sxm-80gb.toml", tmp_path / profile)
    rc, out, err = _run(["recommend", "--params", "7e9", "--gpus", "8", "--hardware", str(profile)], capsys)
    assert rc == 0 and "exp[/x]/h.toml" in out


def test_preset_and_profile_names_are_never_cut(capsys, monkeypatch):
    """What --model and --hardware take: at 80 columns 12 preset names had been cut ('llama3.2…' twice)."""
    from planner.models import list_presets
    import hardware_profiles
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = _run(["models", "list"], capsys)
    assert rc == 0 and "…" not in out and all(n in out for n in list_presets())
    rc, out, _ = _run(["hardware", "list"], capsys)
    assert rc == 0 and all(n in out for n in hardware_profiles.list_profiles())
    # the in-node rate of a node whose groups reach it by size (a PCIe tree) says so, and a node's bridged pairs
    monkeypatch.setenv("COLUMNS", "200")  # a row a line
    rc, out, _ = _run(["hardware", "list"], capsys)
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│") and len(line.split()) > 2}
    assert "by size" in rows["l40s"] and "pairs 300" in rows["h100-pcie-80gb"] and "by" not in rows["h100-sxm-80gb"]


def test_files_that_are_not_plans_say_what_they_are(plan_text, tmp_path, capsys):
    """A Hugging Face config, a hardware profile, a plan cut off and two plans in one file (`>>`): each error says
    what the file is and what to do (they had listed 28 missing fields, or said to add --json)."""
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    toml = tmp_path / "h.toml"
    toml.write_text("# a profile\nname = \"x\"\n")
    cut = tmp_path / "cut.json"
    cut.write_text(plan_text[:300])
    twice = tmp_path / "twice.json"
    twice.write_text(plan_text + plan_text)
    for path, said in ((hf, "is a Hugging Face config.json, not a plan: plan it with `parplan recommend --model-config"),
                       (toml, "a .toml file is a hardware profile (--hardware), not a plan"),
                       (cut, "it ends early (cut off?)"),
                       (twice, "more than one JSON value (a second plan appended with >>?)")):
        rc, out, err = _run(["evaluate", str(path)], capsys)
        assert rc == 2 and said in err and not out, (path, err)


def test_a_plan_naming_another_presets_model_says_its_own_shape_is_predicted(plan_text, tmp_path, capsys):
    """model.name is a label: edited to another preset it had printed 'llama3-70b: 8.03 B params' with nothing said."""
    def rename(d):
        d["model"]["name"] = "llama3-70b"
    rc, out, err = _run(["evaluate", _edited(plan_text, tmp_path, "p.json", rename), "--json"], capsys)
    assert rc == 0 and "names the model llama3-70b, a preset of another shape" in err
    assert json.loads(out)["model"]["layers"] == json.loads(plan_text)["model"]["layers"]
    rc, out, err = _run(["evaluate", _edited(plan_text, tmp_path, "q.json", lambda d: None), "--json"], capsys)
    assert "preset of another shape" not in err
