"""Every bad input: exactly one stderr line naming the problem, the documented exit code, no traceback,
and (exit 2 in --json mode) nothing on stdout.  Runs planner.cli.main in-process."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from planner.cli import main

HF = Path(__file__).parent / "data" / "hf_configs"
R = ["recommend", "--model", "llama3-8b", "--json"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        # a short sequence keeps the CPU launch checks' host-memory need (8 ranks' states and activations) far
        # below any machine's free memory, so only the error under test fails
        assert main(["recommend", "--model", "tiny-llama-test", "--gpus", "8", "--top", "1", "--seq-len", "256",
                     "--json"]) == 0
    good = json.loads(buf.getvalue())
    good["alternatives"] = []
    out = {}

    def put(name, text):
        p = d / name
        p.write_text(text)
        out[name] = str(p)

    put("good.json", json.dumps(good))
    put("list.json", "[1, 2]")
    put("empty.json", "")
    put("blank.json", "  \n")
    put("malformed.json", "{bad")
    put("unknown_key.json", json.dumps({**good, "bogus": 1}))
    put("unknown_nested.json", json.dumps({**good, "parallel": {**good["parallel"], "tpp": 2}}))
    put("wrong_type.json", json.dumps({**good, "training": {**good["training"], "seq_len": "long"}}))
    put("negative.json", json.dumps({**good, "parallel": {**good["parallel"], "dp": -8}}))
    put("string.json", json.dumps("plan"))
    put("world_mismatch.json", json.dumps({**good, "parallel": {**good["parallel"], "dp": good["parallel"]["dp"] * 2}}))
    put("bad_hw.json", json.dumps({**good, "hardware": {**good["hardware"], "name": "no-such-gpu"}}))
    put("missing_hw_file.json", json.dumps({**good, "hardware": {**good["hardware"], "name": "hw_gone.toml"}}))
    put("huge_model_plan.json", json.dumps({**good, "model": {**good["model"], "layers": 10 ** 7, "hidden": 10 ** 7,
                                                             "heads": 10 ** 5, "kv_heads": 10 ** 5,
                                                             "ffn_hidden": 10 ** 7}}))
    put("huge_plan.json", json.dumps({**good, "hardware": {**good["hardware"], "gpus": 10 ** 30},
                                      "training": {**good["training"], "global_batch_size": 128 * 10 ** 30}}))
    put("version2.json", json.dumps({**good, "schema_version": 2}))
    put("bool_tp.json", json.dumps({**good, "parallel": {**good["parallel"], "tp": True}}))
    put("binary.json", "\x00\x01\x02")
    (d / "notutf8.json").write_bytes(b"\xff\xfe\xfa")
    out["notutf8.json"] = str(d / "notutf8.json")
    out["missing.json"] = str(d / "missing.json")
    out["dir"] = str(d)

    def edited(name, **par):
        """good with a hand-edited parallel section (world size and micro-batch count kept consistent)."""
        p = {**good["parallel"], "stage_layers": None, **par}
        t = dict(good["training"])
        t["num_microbatches"] = t["global_batch_size"] // (p["dp"] * t["micro_batch_size"])
        put(name, json.dumps({**good, "parallel": p, "training": t}))

    edited("pp_over_layers.json", tp=1, pp=8, dp=1, cp=1, zero_stage=0)  # 4 layers
    edited("empty_rank.json", tp=1, pp=4, dp=2, vpp=1, schedule="1f1b", stage_layers=[2, 0, 0, 2])  # ranks 1, 2: nothing
    edited("vpp_no_pp.json", vpp=2, schedule="interleaved-1f1b")
    edited("ds_zbv.json", tp=1, pp=2, dp=4, vpp=2, schedule="zbv", zero_stage=1)
    put("ds_zbv.json", json.dumps({**json.loads(Path(out["ds_zbv.json"]).read_text()),
                                   "training": {**json.loads(Path(out["ds_zbv.json"]).read_text())["training"],
                                                "framework": "deepspeed"}}))
    put("deep.json", "[" * 100_000 + "]" * 100_000)
    (d / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(good).encode())
    out["bom.json"] = str(d / "bom.json")
    put("report.json", json.dumps({"plan": good, "steps": [], "device": "cpu"}))
    put("huge_hidden_config.json", json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 10**12,
                                               "num_attention_heads": 8, "intermediate_size": 4 * 10**12,
                                               "vocab_size": 1000}))
    prof = (Path(__file__).resolve().parent.parent / "hardware_profiles" / "h100-sxm-80gb.toml").read_text()
    put("reserve.toml", prof.replace("memory_reserve_gbytes = ", "memory_reserve_gbytes = 100 # was "))
    shutil.copy(HF / "Mixtral-8x7B-v0.1.json", d / "moe.json")
    out["moe.json"] = str(d / "moe.json")
    # found by a CLI audit (2026-11-29): Hugging Face configs with a field of the wrong kind, a plan, report or
    # profile with an integer of more digits than Python reads, a plan where a report belongs
    hf = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
          "intermediate_size": 688, "vocab_size": 1000}
    put("hf_window_str.json", json.dumps({**hf, "model_type": "gemma2", "sliding_window": "big"}))
    put("hf_context_str.json", json.dumps({**hf, "max_position_embeddings": "long"}))
    put("hf_pattern_str.json", json.dumps({**hf, "model_type": "gemma3_text", "sliding_window": 128,
                                           "sliding_window_pattern": "x"}))
    put("hf_text_config_list.json", json.dumps({"model_type": "gemma3", "text_config": [1]}))
    put("hf_hidden_1e400.json", json.dumps({**hf, "hidden_size": 10 ** 400}))
    put("hf_context_1e400.json", json.dumps({**hf, "max_position_embeddings": 10 ** 400}))  # was an OverflowError
    put("hf_window_1e400.json", json.dumps({**hf, "model_type": "mistral", "sliding_window": 10 ** 400}))
    put("hf_deep.json", '{"a": ' * 100_000 + "1" + "}" * 100_000)
    put("hf_5000_digits.json", json.dumps(hf).replace('"vocab_size": 1000', '"vocab_size": ' + "9" * 5000))
    put("hf_bom_free.json", json.dumps(hf))
    (d / "hf_bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(hf).encode())
    out["hf_bom.json"] = str(d / "hf_bom.json")
    put("null.json", "null")
    put("digits.json", json.dumps(good).replace('"tp": 1', '"tp": ' + "9" * 5000, 1))
    put("report_digits.json", json.dumps({"plan": good, "steps": [{"step_time_s": 1.0}], "device": "cuda"})
        .replace('"step_time_s": 1.0', '"step_time_s": ' + "9" * 5000))
    put("digits.toml", prof.replace("gpus_per_node = 8", "gpus_per_node = " + "9" * 5000, 1))
    return out


# (argv, exit code, words the stderr line must contain)
CASES = [
    # a device read as a file never ends (/dev/zero): refused before it is read
    (["evaluate", "/dev/zero", "--json"], 2, ["plan file /dev/zero is a device"]),
    (R[:1] + ["--model-config", "/dev/zero", "--gpus", "8", "--json"], 2, ["/dev/zero is a device"]),
    (["calibrate", "--from-run", "/dev/zero"], 2, ["/dev/zero is not a regular file"]),
    (R + ["--hardware", "/dev/zero"], 2, ["/dev/zero is not a regular file"]),
    (R[:1] + ["--model", "llama3-8b", "--gpus", "0", "--json"], 2, ["--gpus"]),
    (R[:1] + ["--model-config", "-", "--gpus", "8", "--json"], 2, ["not stdin (-)", "config.json"]),
    (["models", "show", "cfg/config.json"], 2, ["unknown model preset", "--model-config cfg/config.json"]),
    # a sequence no cp split divides: the fix is worded as one to take, not as the input
    (R[:1] + ["--model", "llama3-8b", "--gpus", "8", "--cp", "8", "--seq-len", "4", "--json"], 2,
     ["use --seq-len 16, which splits into 2 x cp 8 chunks"]),
    # a file name over the system's 255 bytes: the input's, not an internal error
    (["validate", "--reference-dir", "a" * 300, "--json"], 2, ["file name too long", "shorter path"]),
    (["calibrate", "--from-run", str(Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "2026-11-23-h100"
                                     / "grid-2" / "llama-0.5b-mbs1-full" / "report.json"),
      "--out", "a" * 300 + ".toml"], 2, ["shorter path"]),
    (R + ["--head-dim", "64"], 2, ["--head-dim", "explicit shape"]),
    (R[:1] + ["--model", "llama3-8b", "--gpus", "1", "--sp", "--json"], 2, ["--sp", "tp > 1"]),
    (["recommend", "--params", "7e9", "--untied-embeddings", "--json"], 2, ["embeddings", "explicit shape"]),
    (["recommend", "--layers", "2", "--hidden", "256", "--heads", "4", "--head-dim", "0", "--json"], 2, ["--head-dim"]),
    (R + ["--gpus", "-8"], 2, ["--gpus"]),
    (R + ["--gpus", "abc"], 2, ["--gpus"]),
    (R + ["--gpus", "nan"], 2, ["--gpus"]),
    (["recommend", "--params", "0", "--json"], 2, ["--params"]),
    (["recommend", "--params", "-1", "--json"], 2, ["--params"]),
    (["recommend", "--params", "abc", "--json"], 2, ["--params"]),
    (["recommend", "--params", "nan", "--json"], 2, ["--params"]),
    (["recommend", "--params", "inf", "--json"], 2, ["--params"]),
    (["recommend", "--params", "2e6", "--json"], 2, ["--params", "--layers"]),  # no standard shape that small
    (["recommend", "--params", "1e30", "--json"], 2, ["--params", "max"]),
    # at the bound the derived shape rounds past it: said of --params, not as an "invalid plan" to write again
    (["recommend", "--params", "1e14", "--json"], 2, ["--params 1e14", "nearest standard shape", "smaller --params"]),
    (["recommend", "--params", "1000", "--json"], 2, ["--params"]),
    (["recommend", "--params", "70e9B", "--json"], 2, ["exponent and a unit", "70B"]),  # 7e19 was read
    (R + ["--seq-len", "0"], 2, ["--seq-len"]),
    (R + ["--global-batch-size", "0"], 2, ["--global-batch-size"]),
    (R + ["--hardware", "no-such-gpu"], 2, ["no-such-gpu", "available"]),
    (["recommend", "--model", "llama3-8bb", "--json"], 2, ["llama3-8bb", "did you mean", "llama3-8b"]),
    (["recommend", "--params", "7e9", "--arch", "bogus", "--json"], 2, ["--arch", "llama"]),
    (R + ["--tp", "3", "--gpus", "8"], 2, ["--tp", "divide"]),
    (["recommend", "--params", "70e9", "--gpus", "40", "--tp", "5", "--json"], 2, ["--tp 5", "heads"]),
    (R + ["--pp", "1000"], 2, ["--pp"]),
    (R + ["--zero", "7"], 2, ["--zero"]),
    (R + ["--recompute", "bogus"], 2, ["--recompute", "selective"]),
    (R + ["--schedule", "bogus"], 2, ["--schedule", "1f1b"]),
    (R + ["--dtype", "int3"], 2, ["--dtype"]),
    (R + ["--objective", "fastest"], 2, ["--objective"]),
    (R + ["--inter-node-bandwidth", "nan"], 2, ["--inter-node-bandwidth"]),
    (R + ["--inter-node-bandwidth", "inf"], 2, ["--inter-node-bandwidth"]),
    (R + ["--inter-node-bandwidth", "-5"], 2, ["--inter-node-bandwidth"]),
    (R + ["--inter-node-bandwidth", "fast"], 2, ["--inter-node-bandwidth"]),
    (R + ["--top", "0"], 2, ["--top"]),
    (R + ["--tokens", "lots"], 2, ["--tokens"]),
    (R + ["--bogus-option"], 2, ["no such option", "`parplan recommend --help`"]),
    (["calibrate", "--host-only", "--base", "nope"], 2, ["--base", "unknown hardware profile"]),  # was: no CUDA GPU
    (["calibrate", "--base", "nope"], 2, ["--base", "unknown hardware profile"]),
    (["recommend", "--gpus"], 2, ["requires an argument", "`parplan recommend --help`"]),  # was `parplan --help`
    (["recommend", "--json=false"], 2, ["does not take a value", "`parplan recommend --help`"]),
    (["models", "list", "--x"], 2, ["no such option", "`parplan models list --help`"]),
    (["--bogus"], 2, ["no such option", "`parplan --help`"]),
    (["--bogus", "recommend"], 2, ["no such option", "`parplan --help`"]),  # a top-level option, before the command
    (["models", "show", "--json=x"], 2, ["does not take a value", "`parplan models show --help`"]),
    (["recommend", "--layers", "4", "--json"], 2, ["--hidden", "--heads"]),
    (["recommend", "--json"], 2, ["--model"]),
    (["calibrate", "--from-run", "--out", "x.toml"], 2, ["--from-run needs a launch report", "--out"]),
    # rotary positions pair a head's channels: an odd head_dim had passed the planner and crashed every rank
    (["recommend", "--layers", "2", "--hidden", "60", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "160",
      "--vocab", "512", "--gpus", "1", "--json"], 2, ["head_dim must be even", "15"]),
    (["no-such-command"], 2, ["no-such-command"]),
    (["evaluate"], 2, ["missing", "plan_file"]),
    (["export", "{good.json}"], 2, ["--to"]),
    (["export", "{good.json}", "--to", "nemo"], 2, ["--to", "megatron"]),
    (["compare", "-", "-"], 2, ["stdin"]),
    (["sweep", "--model", "tiny-llama-test", "--gpus-list", "8,x", "--json"], 2, ["--gpus-list"]),
    (["sweep", "--model", "tiny-llama-test", "--gpus-list", ",", "--json"], 2, ["--gpus-list"]),
    (["sweep", "--model", "tiny-llama-test", "--gpus-list", "0", "--json"], 2, ["--gpus-list"]),
    (["recommend", "--model-config", "{missing.json}", "--json"], 2, ["missing.json"]),
    (["recommend", "--model-config", "{malformed.json}", "--json"], 2, ["json"]),
    # a mixture of experts (Mixtral's config) is planned under --framework megatron, parplan and torchtitan only;
    # parplan's runtime dispatches with torch's all-to-all; torchtitan's ep takes every tp rank (etp 1)
    (["recommend", "--model-config", "{moe.json}", "--framework", "deepspeed", "--json"], 2,
     ["mixture of experts", "--framework megatron, parplan or torchtitan"]),
    (["recommend", "--model-config", "{moe.json}", "--framework", "torchtitan", "--tp", "2", "--ep", "1", "--json"],
     2, ["splits each expert by tensor parallelism", "an --ep above 1"]),
    (["recommend", "--model-config", "{moe.json}", "--moe-dispatcher", "deepep", "--json"], 2,
     ["torch.distributed's all-to-all", "--framework megatron"]),
    (["recommend", "--model-config", "{moe.json}", "--model", "llama3-8b", "--json"], 2, ["only one"]),
    # Megatron-Core's combined 1F1B: a mixture of experts' all-to-alls under megatron, on the layouts it runs
    (["recommend", "--model-config", "{moe.json}", "--moe-a2a-overlap", "--json"], 2,
     ["not a parplan schedule", "--framework megatron"]),
    (["recommend", "--model", "llama3-8b", "--framework", "megatron", "--moe-a2a-overlap", "--json"], 2,
     ["dense", "drop --moe-a2a-overlap"]),
    (["recommend", "--model-config", "{moe.json}", "--framework", "megatron", "--moe-a2a-overlap", "--pp", "2",
      "--schedule", "1f1b", "--json"], 2, ["interleaved 1F1B", "--vpp 2 or more"]),
    (["launch", "--dry-run", "{good.json}", "--steps", "0"], 2, ["--steps"]),
    (["launch", "--dry-run", "{good.json}", "--device", "tpu"], 2, ["--device"]),
    (["launch", "--dry-run", "{good.json}", "--node-rank", "3"], 2, ["--node-rank"]),
    (["launch", "--dry-run", "{good.json}", "--data-dtype", "int8"], 2, ["--data-dtype", "uint16, uint32"]),
    (["launch", "--dry-run", "{good.json}", "--resume-step", "0"], 2, ["--resume-step"]),
    (["models", "show", "nope"], 2, ["nope"]),
    # every layout rejected for the batch split: said in words, with a batch that splits over the pinned dp
    (["recommend", "--model", "tiny-llama-test", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "1",
      "--global-batch-size", "12", "--json"], 2, ["multiple of dp x micro-batch", "use --global-batch-size 16, which splits over dp 8"]),
    # a micro-batch larger than the whole batch: the micro-batch is what to change (a batch of 2048 over dp 1 had
    # been offered, where nothing then fits)
    (["recommend", "--model", "llama3-8b", "--mbs", "2048", "--json"], 2,
     ["--mbs 2048 is more sequences than the whole global batch (1024)", "give a smaller --mbs"]),
    (["recommend", "--model", "llama3-8b", "--mbs", "3", "--json"], 2,
     ["use --global-batch-size 1032, which splits over dp 8 x micro-batch 3"]),
    (["recommend", "--model", "llama3-8b", "--vpp", "3", "--pp", "1", "--json"], 2, ["--vpp 3 with --pp 1", "drop --vpp"]),
    (["recommend", "--model", "llama3-8b", "--tokens", "0.5", "--json"], 2, ["less than one token"]),
    (["recommend", "--model", "llama3-8b", "--tp", "2", "--pp", "2", "--dp", "4", "--json"], 2,
     ["multiply to 16, more than --gpus 8"]),
    (["hardware", "show", "nope"], 2, ["nope"]),
    # the Triton kernel is timed from FlashAttention-2's published speed, which only some profiles have
    (["recommend", "--model", "llama3-8b", "--hardware", "h200-sxm-141gb", "--attention-kernel", "triton-2022",
      "--json"], 2, ["flash_attention_2_tflops", "--attention-kernel profile"]),
    (["recommend", "--model", "llama3-8b", "--attention-kernel", "flash3", "--json"], 2, ["--attention-kernel must be one of"]),
    (["recommend", "--params", "-1", "--json"], 2, ["--params must be a positive number"]),
    (["recommend", "--model", "llama3-8b", "--hardware", "/tmp", "--json"], 2, ["is a folder", "h100-sxm-80gb"]),
    (["recommend", "--model", "llama3-8b", "--hardware", "/nonexistent/p.toml", "--json"], 2,
     ["does not exist", "calibrate --out"]),
    (["recommend", "--model", "llama3-8b", "--hardware", "{reserve.toml}", "--json"], 2,
     ["memory_reserve_gbytes", "below hbm_gbytes"]),
    (["recommend", "--layers", "2", "--hidden", "256", "--head-dim", "64", "--model", "llama3-8b", "--json"], 2,
     ["only one of"]),
    (["launch", "{good.json}", "--device", "cpu", "--nnodes", "2", "--rdzv-endpoint", "node0"], 2, ["HOST:PORT"]),
    # found by a CLI audit (2026-11-24): each was an internal error, a silent wrong answer or an unclear line
    (R + ["--tokens", "1e30"], 2, ["--tokens", "max 1e18"]),
    # (a GPU's name alone is its profile where only one has it, since 2026-12-04: h100 reads h100-sxm-80gb; a100 names two)
    (R + ["--hardware", "a100"], 2, ["unknown hardware profile",
                                     "did you mean a100-pcie-80gb or a100-sxm-40gb or a100-sxm-80gb"]),
    (R + ["--vocab", "1000"], 2, ["--vocab", "explicit shape"]),
    (R + ["--kv-heads", "32"], 2, ["--kv-heads", "explicit shape"]),
    (R + ["--arch", "gpt"], 2, ["--arch", "explicit shape"]),
    (["recommend", "--params", "7e9", "--ffn-hidden", "1000", "--json"], 2, ["--ffn-hidden", "explicit shape"]),
    (R + ["--heads", "8"], 2, ["only one of"]),
    (R + ["--inter-node-bandwidth", "1e-300"], 2, ["--inter-node-bandwidth", "min 0.001"]),
    (["recommend", "--model-config", "{huge_hidden_config.json}", "--json"], 2, ["hidden", "max 1e+07"]),
    (["recommend", "--layers", "32", "--hidden", "4096", "--heads", "7", "--json"], 2, ["divisible by heads"]),
    (R + ["--gpus", "8", "--cp", "2", "--seq-len", "4095"], 2, ["breaks a rule", "--seq-len 4096"]),
    (["sweep", "--model", "tiny-llama-test", "--gpus-list", "99999999", "--json"], 2, ["--gpus-list", "max 1e+06"]),
    (["validate", "--reference-dir", "/nonexistent", "--json"], 2, ["--reference-dir", "not a folder"]),
    (["evaluate", "{pp_over_layers.json}", "--json"], 2, ["pp 8", "4 layers"]),
    (["evaluate", "{empty_rank.json}", "--json"], 2, ["stage_layers", "without a block"]),
    (["evaluate", "{vpp_no_pp.json}", "--json"], 2, ["vpp 2", "pp 1"]),
    (["evaluate", "{ds_zbv.json}", "--json"], 2, ["zbv", "deepspeed"]),
    (["export", "{ds_zbv.json}", "--to", "deepspeed"], 2, ["zbv", "deepspeed"]),
    (["evaluate", "{deep.json}", "--json"], 2, ["nested too deeply"]),
    (["evaluate", "{report.json}", "--json"], 2, ["launch` report", "plan.json"]),
    (["evaluate", "{notutf8.json}", "--json"], 2, ["not utf-8"]),
    (["evaluate", "{dir}", "--json"], 2, ["is a folder"]),
    (["launch", "{good.json}", "--device", "cpu", "--report", "{good.json}"], 2, ["plan file itself"]),
    (["launch", "{good.json}", "--device", "cpu", "--report", "/proc/parplan-nope/report.json"], 2, ["cannot write"]),
    (["calibrate", "--from-run", "{notutf8.json}"], 2, ["not utf-8"]),
    (["calibrate", "--from-run", "{report.json}", "--out", ""], 2, ["--out is empty"]),
    # found by a CLI audit (2026-11-29): each was an internal error, a silent default or a misleading line
    (["recommend", "--model-config", "{hf_window_str.json}", "--json"], 2, ["sliding_window must be a positive integer"]),
    (["recommend", "--model-config", "{hf_context_str.json}", "--json"], 2,
     ["max_position_embeddings must be a positive integer"]),
    (["recommend", "--model-config", "{hf_pattern_str.json}", "--json"], 2,
     ["sliding_window_pattern must be a positive integer"]),
    (["recommend", "--model-config", "{hf_text_config_list.json}", "--json"], 2, ["text_config must be a json object"]),
    (["recommend", "--model-config", "{hf_hidden_1e400.json}", "--json"], 2, ["hidden_size", "~1e+400 is beyond", "max 1e+07"]),
    (["recommend", "--model-config", "{hf_deep.json}", "--json"], 2, ["hf_deep.json", "nested too deeply"]),
    (["recommend", "--model-config", "{hf_5000_digits.json}", "--json"], 2, ["hf_5000_digits.json", "more digits"]),
    (["recommend", "--model-config", "", "--json"], 2, ["--model-config is empty"]),
    # the MLP's default width (8/3 of 1e7) is past the bound before the parameter count is
    (["recommend", "--layers", "10000000", "--hidden", "10000000", "--heads", "5000000", "--json"], 2,
     ["ffn_hidden", "2.67e+07 is beyond", "max 1e+07"]),
    (["evaluate", "", "--json"], 2, ["plan file name is empty", "- for stdin"]),
    (["evaluate", "{null.json}", "--json"], 2, ["json object, got null"]),
    (["evaluate", "{huge_model_plan.json}", "--json"], 2, ["parameters is beyond", "max 1e+14"]),  # each dim within
    (["evaluate", "{huge_plan.json}", "--json"], 2, ["hardware.gpus", "1e+30 is beyond", "max 1e+06",
                                                    "training.global_batch_size"]),  # a plan file is held to the flags' bounds
    (["evaluate", "{digits.json}", "--json"], 2, ["digits.json", "more digits"]),
    (["launch", "{digits.json}", "--dry-run", "--device", "cpu"], 2, ["digits.json", "more digits"]),
    (R + ["--hardware", "{digits.toml}"], 2, ["digits.toml", "more digits"]),
    (["launch", "{good.json}", "--dry-run", "--device", "cpu", "--data", ""], 2, ["--data is empty"]),
    (["launch", "{good.json}", "--dry-run", "--device", "cpu", "--report", " "], 2, ["--report is empty"]),
    (["launch", "{good.json}", "--dry-run", "--device", "cpu", "--checkpoint-dir", ""], 2, ["--checkpoint-dir is empty"]),
    (["launch", "{good.json}", "--dry-run", "--device", "cpu", "--memory-snapshot", ""], 2,
     ["--memory-snapshot is empty"]),
    (["launch", "{good.json}", "--dry-run", "--device", "cpu", "--profile", ""], 2, ["--profile is empty"]),
    (["validate", "--reference-dir", "", "--json"], 2, ["--reference-dir is empty"]),
    (["calibrate", "--from-run", "{good.json}"], 2, ["is a plan, not a launch report", "report.json"]),
    (["calibrate", "--from-run", "{dir}"], 2, ["is a folder", "report.json"]),
    (["calibrate", "--from-run", "-"], 2, ["not stdin"]),
    (["calibrate", "--from-run", "{report_digits.json}"], 2, ["report_digits.json", "more digits"]),
]

BAD_PLANS = {
    "missing.json": ["not found"], "list.json": ["json object", "list"], "string.json": ["json object"],
    "empty.json": ["empty"], "blank.json": ["empty"], "malformed.json": ["not valid json"],
    "unknown_key.json": ["bogus"], "unknown_nested.json": ["tpp"], "wrong_type.json": ["seq_len"],
    "negative.json": ["dp"], "world_mismatch.json": ["gpus"], "bad_hw.json": ["the plan's hardware.name 'no-such-gpu'", "edit hardware.name"],
    "missing_hw_file.json": ["the plan's hardware.name 'hw_gone.toml'", "run from the folder the plan was made in"],
    "binary.json": ["json"], "notutf8.json": ["plan"], "dir": ["plan"], "version2.json": ["schema_version 2"],
    "bool_tp.json": ["tp: expected a number"],
}
for _name, _words in BAD_PLANS.items():
    for _cmd in (["evaluate", "--json"], ["export", "--to", "torchtitan"], ["launch", "--dry-run", "--device", "cpu"],
                 ["explain", "--json"], ["compare", "{good.json}"]):
        if _name in ("bad_hw.json", "missing_hw_file.json") and _cmd[0] in ("export", "launch"):
            continue  # export/launch take the profile name as given; only the cost model needs it
        CASES.append(([_cmd[0], "{%s}" % _name] + _cmd[1:], 2, _words))


def _fill(argv, files):
    return [files[a[1:-1]] if a.startswith("{") and a.endswith("}") else a for a in argv]


@pytest.mark.parametrize("argv,code,words", CASES, ids=[" ".join(c[0])[:70] for c in CASES])
def test_bad_input_is_one_line(argv, code, words, files, capsys):
    rc = main(_fill(argv, files))
    out, err = capsys.readouterr()
    assert rc == code, (rc, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("note: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    low = lines[0].lower()
    for w in words:
        assert w.lower() in low, (w, lines[0])
    if code == 2:
        assert out == "", out


def test_nothing_fits_keeps_json_on_stdout(capsys):
    rc = main(["recommend", "--model", "llama3-405b", "--gpus", "8", "--json"])
    out, err = capsys.readouterr()
    assert rc == 3
    plan = json.loads(out)
    assert plan["prediction"]["fits"] is False and plan["prediction"]["reason"]
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("error: ")]


def test_internal_error_is_one_line(monkeypatch, capsys):
    import planner.core

    def boom(*a, **k):
        raise ZeroDivisionError("float division by zero")
    monkeypatch.setattr(planner.core, "recommend", boom)
    rc = main(["recommend", "--model", "llama3-8b", "--json"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "ZeroDivisionError" in err and "PARPLAN_DEBUG" in err


def test_explain_of_a_plan_that_does_not_fit_says_so_on_stderr(files, capsys, tmp_path):
    """Exit 3 with --json: the JSON on stdout, and a line on stderr saying why (it was silent)."""
    plan = json.loads(Path(files["good.json"]).read_text())
    plan["training"]["seq_len"] = 1 << 20  # a million tokens on the tiny model's 8 ranks
    p = tmp_path / "big.json"
    p.write_text(json.dumps(plan))
    rc = main(["explain", str(p), "--json"])
    out, err = capsys.readouterr()
    assert rc == 3 and json.loads(out) and "does not fit" in err and "Traceback" not in err


def test_a_validators_sentence_is_not_prefixed_by_pydantic(files, capsys):
    plan = json.loads(Path(files["good.json"]).read_text())
    plan["training"]["num_microbatches"] += 1  # the batch no longer splits
    from planner.cli import _one_line
    from planner.schema import Plan
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as e:
        Plan.model_validate(plan)
    line = _one_line(e.value)
    assert "Value error" not in line and line.startswith("invalid plan: ") and "plan: " not in line[14:]


def test_a_plan_saved_with_a_byte_order_mark_reads(files, capsys):
    """Some Windows editors save UTF-8 with a BOM; the plan is the same plan."""
    assert main(["evaluate", files["bom.json"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"] == json.loads(Path(files["good.json"]).read_text())["parallel"]


def test_export_of_a_plan_that_does_not_fit_warns_and_exits_3(tmp_path, capsys):
    """export re-predicts the plan it is given (a hand edit may no longer fit): the export is still printed, a
    warning names why, and the exit code is 3, as recommend's for nothing fits."""
    assert main(["recommend", "--model", "llama3-70b", "--gpus", "64", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    plan["parallel"].update(tp=1, pp=1, dp=64, cp=1, vpp=1, sp=False, zero_stage=0, schedule="1f1b",
                            stage_layers=None, recompute="none", offload="none")
    plan["training"]["num_microbatches"] = plan["training"]["global_batch_size"] // (64 * plan["training"]["micro_batch_size"])
    plan["alternatives"] = []
    f = tmp_path / "nofit.json"
    f.write_text(json.dumps(plan))
    assert main(["export", str(f), "--to", "torchtitan"]) == 3
    out, err = capsys.readouterr()
    assert "[parallelism]" in out
    assert "does not fit (memory: needs" in err


def test_a_layout_slower_than_one_gpu_has_no_amdahl_fraction(capsys):
    """Over a 10 MB/s network dp 16 is slower than one GPU's compute: the speedup says so (< 1) and the Amdahl
    fraction, which cannot describe a slowdown, reads 0 instead of going negative."""
    argv = ["recommend", "--model", "llama3-8b", "--gpus", "16", "--dp", "16", "--inter-node-bandwidth", "0.01"]
    assert main(argv + ["--json"]) == 0
    amdahl = json.loads(capsys.readouterr().out)["prediction"]["amdahl"]
    assert amdahl["parallel_fraction"] == 0.0 and 0 < amdahl["speedup"] < 1
    assert main(argv) == 0
    assert "no parallel speedup" in capsys.readouterr().out
    # one GPU splits nothing: no speedup line blaming communication there is none of
    assert main(["recommend", "--model", "gpt2", "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "one GPU: no parallel speedup to report" in out and "communication" not in out
    assert main(["recommend", "--model", "llama3-8b", "--gpus", "16", "--json"]) == 0
    amdahl = json.loads(capsys.readouterr().out)["prediction"]["amdahl"]
    assert 0.9 < amdahl["parallel_fraction"] <= 1 and amdahl["speedup"] > 1


def test_a_hugging_face_config_saved_with_a_byte_order_mark_reads(files, capsys):
    """As plans, reports and profiles: a BOM-prefixed config.json is the same config (it was 'not valid JSON')."""
    assert main(["recommend", "--model-config", files["hf_bom.json"], "--json"]) == 0
    with_bom = json.loads(capsys.readouterr().out)
    assert main(["recommend", "--model-config", files["hf_bom_free.json"], "--json"]) == 0
    assert with_bom["parallel"] == json.loads(capsys.readouterr().out)["parallel"]
    assert with_bom["model"]["num_params"] > 0


def test_an_empty_hardware_name_guesses_no_profile(capsys):
    """Every profile name starts with '': an empty --hardware was answered 'did you mean a100-sxm-40gb?'."""
    assert main(R + ["--hardware", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "unknown hardware profile ''" in err and "did you mean" not in err
    assert "here is a folder" not in err  # Path("") is the folder here: it had read "( here is a folder: ... ./)"


def test_a_hardware_name_in_another_case_is_the_shipped_profile(capsys):
    """As model presets: H100-SXM-80GB is h100-sxm-80gb, and the plan records the name as shipped."""
    assert main(R + ["--hardware", "H100-SXM-80GB"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"]["name"] == "h100-sxm-80gb"
    assert main(["hardware", "show", "H200-sxm-141GB"]) == 0
    assert "h200-sxm-141gb" in capsys.readouterr().out


def test_a_full_disk_is_not_reported_as_a_bug(monkeypatch, capsys):
    """stdout on a full disk (`> /dev/full`): one line saying the output could not be written, exit 1, not an
    'internal error ... a bug in parplan'."""
    import errno
    import sys

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sys, "stdout", Full())
    rc = main(["schema"])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot write the output: No space left on device" in err
    assert "internal error" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("stdin,words", [
    (lambda: io.TextIOWrapper(io.BytesIO(b"\xff\xfe{}"), encoding="utf-8", errors="strict"), "not UTF-8 text (byte 0"),
    (lambda: None, "stdin is closed"),
], ids=["not utf-8", "closed"])
def test_a_plan_on_stdin_that_cannot_be_read_is_one_line(stdin, words, monkeypatch, capsys):
    """A stray byte on stdin under a strict UTF-8 locale (en_US.UTF-8: not C.UTF-8's surrogateescape), or a closed
    stdin (`<&-`), were internal errors."""
    import sys
    for argv in (["evaluate", "-", "--json"], ["launch", "-", "--dry-run", "--device", "cpu"]):
        monkeypatch.setattr(sys, "stdin", stdin())
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and err.startswith("error: ") and words in err, err
        assert len(err.strip().splitlines()) == 1 and "internal error" not in err


@pytest.mark.parametrize("name", ["hf_context_1e400.json", "hf_window_1e400.json"])
def test_a_huge_context_or_window_is_only_a_long_one(name, files, capsys):
    """A 400-digit max_position_embeddings or sliding_window is a whole positive number: the context is long and
    the window never binds, so the plan is made (it was an OverflowError, "a bug in parplan")."""
    rc = main(_fill(["recommend", "--model-config", "{" + name + "}", "--json"], files))
    out, err = capsys.readouterr()
    assert rc == 0 and "internal error" not in err, err
    assert json.loads(out)["prediction"]["fits"] is True


def test_a_profile_name_that_is_a_file_or_folder_here_says_so(tmp_path, monkeypatch, capsys):
    """--hardware NAME with no separator or suffix is read as a shipped profile's name; where a folder or a file of
    that name is in the working folder, the error says how to give it as a path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "noext").write_text("name = 'x'\n")
    for name, kind in (("adir", "folder"), ("noext", "file")):
        assert main(R + ["--gpus", "8", "--hardware", name]) == 2
        err = capsys.readouterr().err
        assert f"{name} here is a {kind}" in err and f"./{name}" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv", [["models", "list"], ["hardware", "list"], ["recommend", "--model", "gpt2"],
                                  ["recommend", "--model", "gpt2", "--json"]])
def test_a_closed_stdout_is_an_error_for_tables_and_json(monkeypatch, capsys, argv):
    """`parplan ... >&-`: Python starts with no sys.stdout; rich's console printed nowhere and exited 0 where the JSON
    path said so with exit 1.  Both say it now."""
    import sys
    monkeypatch.setattr(sys, "stdout", None)
    assert main(argv) == 1
    assert "error: stdout is closed" in capsys.readouterr().err


def test_ctrl_c_says_interrupted_in_one_line(monkeypatch, capsys):
    """typer turns a KeyboardInterrupt into a silent Exit(130) (typer.core), which main says: the exit is 130 with
    one line (it had been silent), and Python's SIGINT handler is left in place."""
    import os
    import signal
    import time

    import planner.core

    def interrupted(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises KeyboardInterrupt here
        raise AssertionError("no interrupt")
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's, as a shell's parplan has
    try:
        monkeypatch.setattr(planner.core, "recommend", interrupted)
        assert main(["recommend", "--model", "llama3-8b", "--json"]) == 130
        out, err = capsys.readouterr()
        assert out == "" and err == "error: interrupted\n"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back
    finally:
        signal.signal(signal.SIGINT, saved)


def test_a_keyboard_interrupt_raised_by_code_says_interrupted(monkeypatch, capsys):
    """A KeyboardInterrupt raised without a signal reaches main as typer's Exit(130) too: one line (it had been
    silent while main told Ctrl-C apart by its own SIGINT handler)."""
    import planner.core

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(planner.core, "recommend", interrupted)
    assert main(["recommend", "--model", "llama3-8b", "--json"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == "error: interrupted\n"


@pytest.mark.parametrize("err, fix", [(13, "change its permissions"), (1, "change its permissions"),
                                      (30, "writable file system")])
def test_a_path_the_system_refuses_is_the_inputs_fault_wherever_it_is_opened(monkeypatch, capsys, err, fix):
    """A folder the user may not enter, a file they may not read or write, a read-only mount, met by any command
    (launch's --report or --data inside such a folder, calibrate's --out, validate's --reference-dir): exit 2 naming
    the path and the fix, where it had read "internal error PermissionError ... (a bug in parplan)"."""
    import os

    import planner.core

    def refused(*a, **k):
        raise OSError(err, os.strerror(err), "locked/out.toml")
    monkeypatch.setattr(planner.core, "recommend", refused)
    assert main(["recommend", "--model", "llama3-8b", "--json"]) == 2
    out, msg = capsys.readouterr()
    assert out == "" and msg.startswith("error: locked/out.toml: ") and fix in msg and len(msg.splitlines()) == 1, msg
    assert "internal error" not in msg


def test_choices_are_read_in_any_case(capsys):
    """--framework Megatron, --dtype BF16, --schedule 1F1B, --recompute FULL were refused where --to MEGATRON,
    --hardware H100-SXM-80GB and model names in any case are read: every choice is, and the plan records it as listed."""
    argv = ["recommend", "--model", "llama3-8b", "--gpus", "8", "--framework", "Megatron", "--dtype", "BF16",
            "--schedule", "1F1B", "--recompute", "FULL", "--objective", "Throughput", "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["training"]["framework"], plan["training"]["dtype"]) == ("megatron", "bf16")
    assert (plan["parallel"]["schedule"], plan["parallel"]["recompute"]) == ("1f1b", "full")
    assert main(["recommend", "--model", "llama3-8b", "--dtype", "BF17", "--json"]) == 2
    assert capsys.readouterr().err == "error: --dtype must be one of bf16, fp16; got 'BF17'\n"


def test_a_16bit_loss_gradient_without_the_fused_loss_gets_a_note(capsys):
    assert main(["recommend", "--model", "llama3-8b", "--cross-entropy-16bit-grad", "--no-fused-cross-entropy",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)
    assert "note: --cross-entropy-16bit-grad is a mode of the fused cross-entropy" in err


def test_a_hub_name_not_in_the_cache_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    """--model-config owner/model with no such file and nothing cached: exit 2, one line naming the cache and the
    download command, stdout empty in --json mode; cached, it plans (hf_config.cached_hub_config)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    rc = main(["recommend", "--model-config", "Qwen/Qwen3-8B", "--gpus", "8", "--json"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "nor in the Hugging Face cache" in err and "huggingface-cli download Qwen/Qwen3-8B config.json" in err
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 36, "vocab_size": 151936, "head_dim": 128,
        "tie_word_embeddings": False}))
    assert main(["recommend", "--model-config", "Qwen/Qwen3-8B", "--gpus", "8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"]["name"] == "Qwen/Qwen3-8B" and plan["model"]["layers"] == 36
