"""Property tests: any plan JSON (valid, mutated or garbage) fed to `evaluate`, `explain` and
`launch --dry-run --device cpu` ends with exit 0, 2 or 3, never a traceback, and at most a few
stderr lines.  In-process (planner.cli.main) and few examples to stay fast."""
from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from typing import get_args

from hypothesis import HealthCheck, given, settings, strategies as st

from planner.cli import main
from planner.schema import PeakMoment

PEAK_MOMENTS = get_args(PeakMoment)

VALID = {
    "schema_version": 1,
    "model": {"name": "tiny", "arch": "llama", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 8,
              "ffn_hidden": 688, "vocab": 1000},
    "hardware": {"name": "h100-sxm-80gb", "gpus": 8, "gpus_per_node": 8},
    "training": {"seq_len": 256, "global_batch_size": 16, "micro_batch_size": 1, "num_microbatches": 4,
                 "dtype": "bf16", "precision": "master-weights"},
    "parallel": {"tp": 1, "pp": 2, "dp": 4, "cp": 1, "vpp": 1, "sp": False, "zero_stage": 1,
                 "recompute": "selective", "schedule": "1f1b", "offload": "none"},
}

SETTINGS = settings(max_examples=int(os.environ.get("PARPLAN_PROPERTY_EXAMPLES", "40")), deadline=None,
                    derandomize=not os.environ.get("PARPLAN_PROPERTY_EXAMPLES"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from([0, -1, 1, 2, 3, 7, 64, 1000, 2**31, 2**63, 1e308, -0.0, "bf16", "fp8", "1f1b", "zbv",
                     "interleaved-1f1b", "optimizer", "full", "gpt", "h100-sxm-80gb", "a100-sxm-40gb", ""]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def _paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


PATHS = list(_paths(VALID))


@st.composite
def mutated_plans(draw):
    plan = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(PATHS))
        parent = plan
        for k in path[:-1]:
            parent = parent.get(k) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        action = draw(st.sampled_from(["set", "delete", "extra", "negate"]))
        if action == "set":
            parent[path[-1]] = draw(json_values)
        elif action == "delete":
            parent.pop(path[-1], None)
        elif action == "extra":
            parent[draw(st.text(min_size=1, max_size=8))] = draw(scalars)
        else:
            v = parent.get(path[-1])
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                parent[path[-1]] = -v
    return plan


@st.composite
def valid_layouts(draw):
    """Valid-shaped plans over a small grid: tp x pp x dp = gpus, batch consistent."""
    plan = copy.deepcopy(VALID)
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    mbs = draw(st.sampled_from([1, 2, 4]))
    m = draw(st.sampled_from([1, 2, 4, 8]))
    plan["hardware"]["gpus"] = tp * pp * dp
    plan["hardware"]["gpus_per_node"] = draw(st.sampled_from([1, 4, 8]))
    plan["training"].update(micro_batch_size=mbs, num_microbatches=m, global_batch_size=dp * mbs * m,
                            seq_len=draw(st.sampled_from([128, 256, 1024, 8192])))
    plan["parallel"].update(tp=tp, pp=pp, dp=dp, sp=draw(st.booleans()) and tp > 1,
                            zero_stage=draw(st.integers(0, 3)),
                            recompute=draw(st.sampled_from(["none", "selective", "full"])),
                            schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
                            offload=draw(st.sampled_from(["none", "optimizer"])))
    plan["model"]["layers"] = draw(st.sampled_from([1, 4, 8]))
    return plan


@st.composite
def oversized_layouts(draw):
    """Valid plans of a model far past the GPUs' memory (hidden 32768 to 65536, 64 to 128 layers): exit 3."""
    plan = draw(valid_layouts())
    h = draw(st.sampled_from([32768, 65536]))
    plan["model"].update(hidden=h, heads=h // 128, kv_heads=h // 128, ffn_hidden=4 * h,
                         layers=draw(st.sampled_from([64, 128])))
    return plan


any_plan = st.one_of(valid_layouts(), mutated_plans(), json_values)


def _run(argv_before, doc, argv_after, capsys, max_lines=5):  # 4, and read_plan's note on fields left out
    fd, path = tempfile.mkstemp(suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc, allow_nan=True))
        rc = main(argv_before + [path] + argv_after)
    finally:
        os.unlink(path)
    out, err = capsys.readouterr()
    assert rc in (0, 2, 3), (rc, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) <= max_lines, err
    assert len([ln for ln in lines if ln.startswith("error:")]) <= 1, err
    if rc == 2:
        assert out == ""
    return rc, out, err


def test_seed_plan_is_valid(capsys):
    rc, out, _ = _run(["evaluate"], VALID, ["--json"], capsys)
    assert rc == 0 and json.loads(out)["prediction"]["fits"]


def _check_prediction(rc, out):
    pred = json.loads(out)["prediction"]
    assert pred["fits"] is (rc == 0)
    mem = dict(pred["memory_bytes_per_gpu"])
    by_stage = mem.pop("by_stage")
    assert mem.pop("peak_moment") in PEAK_MOMENTS
    assert all(math.isfinite(v) for v in mem.values())
    # per pipeline rank kind: only the kinds the pipeline has, each at most the total
    assert (by_stage is None) == (json.loads(out)["parallel"]["pp"] == 1)
    assert all(math.isfinite(v) and v <= mem["total"] * (1 + 1e-9) for v in (by_stage or {}).values())


@SETTINGS
@given(any_plan)
def test_evaluate_never_crashes(capsys, doc):
    rc, out, _ = _run(["evaluate"], doc, ["--json"], capsys)
    if rc in (0, 3):
        _check_prediction(rc, out)


@settings(SETTINGS, max_examples=min(SETTINGS.max_examples, 10))
@given(oversized_layouts())
def test_evaluate_plans_that_do_not_fit_exit_3_with_a_full_prediction(capsys, doc):
    # the random mix above rarely draws a valid plan that does not fit: this path, every time
    rc, out, _ = _run(["evaluate"], doc, ["--json"], capsys)
    assert rc == 3
    _check_prediction(rc, out)
    rc, out, _ = _run(["explain"], doc, ["--json"], capsys)
    assert rc == 3 and "memory" in json.loads(out)


@SETTINGS
@given(st.one_of(valid_layouts(), mutated_plans()))
def test_explain_never_crashes(capsys, doc):
    rc, out, _ = _run(["explain"], doc, ["--json"], capsys)
    if rc in (0, 3):
        assert "memory" in json.loads(out)


@SETTINGS
@given(st.one_of(mutated_plans(), json_values, st.text(max_size=40)))
def test_launch_dry_run_never_crashes(capsys, doc):
    # a dry run lists its pre-flight checks on stderr (one line each) before any error, after a note where the plan
    # leaves out fields recommend sets otherwise (read_plan), and a split's warning where its stage_layers is edited
    _run(["launch", "--dry-run", "--device", "cpu"], doc, [], capsys, max_lines=14)
