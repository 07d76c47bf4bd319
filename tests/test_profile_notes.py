"""A profile file's implausible values (hardware_profiles.implausible_values): a unit slip in a hand-made profile
(TB for GB, GFLOP/s for TFLOP/s, a NIC's Gb/s as GB/s) is said in a note on stderr, and the plan still made from it."""
import json
import subprocess
import sys

import pytest

from hardware_profiles import implausible_values, list_profiles, load_profile


@pytest.mark.parametrize("name", list_profiles())
def test_shipped_profiles_are_plausible(name):
    assert implausible_values(load_profile(name)) == []


def _slipped(**changes):
    data = load_profile("h100-sxm-80gb").model_dump(mode="json")
    data["name"] = "mine"
    for key, value in changes.items():
        obj = data
        *parents, leaf = key.split(".")
        for part in parents:
            obj = obj[part]
        obj[leaf] = value
    from planner.schema import HardwareProfile
    return HardwareProfile(**data)


def test_unit_slips_are_named_with_the_field_and_its_unit():
    notes = implausible_values(_slipped(**{"peak_dense_tflops.bf16": 989_400.0, "hbm_gbytes": 81_920.0,
                                           "inter_node.gbytes_per_s": 400.0}))
    assert len(notes) == 3
    assert "peak_dense_tflops.bf16 = 989400 is over 10x the largest shipped profile's" in notes[0] and "TFLOP/s" in notes[0]
    assert "hbm_gbytes = 81920 is over 10x the largest shipped profile's" in notes[1]  # MB written as GB
    assert "inter_node.gbytes_per_s = 400 is over 2x" in notes[2] and "GB/s per GPU per direction" in notes[2]
    # a NIC faster a GPU than the node's own fabric, inside the shipped range
    fast_nic = implausible_values(_slipped(**{"nvlink.gbytes_per_s": 32.0, "inter_node.gbytes_per_s": 50.0}))
    assert len(fast_nic) == 1 and "faster a GPU than the node's own fabric" in fast_nic[0]
    assert implausible_values(_slipped(**{"hbm_gbytes": 500.0})) == []  # 2x the largest shipped: a part to come


def test_cli_says_them_on_stderr_and_plans_anyway(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(_slipped(hbm_gbytes_per_s=3.35).model_dump_json())
    out = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "llama3-8b", "--gpus", "8",
                          "--hardware", str(path), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["hardware"]["name"] == str(path)
    said = [line for line in out.stderr.splitlines() if line.startswith("note: profile mine:")]
    assert len(said) == 1 and "hbm_gbytes_per_s = 3.35 is under 1/10" in said[0] and "GB/s: check it" in said[0]
    plain = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "llama3-8b", "--gpus", "8",
                            "--json"], capture_output=True, text=True)
    assert plain.returncode == 0 and "note: profile" not in plain.stderr
