"""Hardware profiles: every shipped file validates, the generated curves match the measurement they
were built from, and the loader's errors are one readable line."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hardware_profiles
from hardware_profiles import PROFILE_DIR, list_profiles, load_profile
from planner.schema import HardwareProfile

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {"a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200", "mi300x"}


def _build_module():
    spec = importlib.util.spec_from_file_location("build_h100_curve", ROOT / "benchmarks" / "build_h100_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_expected_profiles_ship():
    assert EXPECTED <= set(list_profiles())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_validates_and_is_documented(name):
    path = PROFILE_DIR / f"{name}.toml"
    raw = tomllib.loads(path.read_text())
    prof = HardwareProfile(**raw)  # strict schema, extra="forbid"
    assert prof.name == name == path.stem
    text = path.read_text()
    # at most one parameter may be fitted to training runs, and the file says which ("# fitted: none" until then)
    fitted = re.findall(r"^# fitted: (.+)$", text, re.M)
    assert len(fitted) == 1, "exactly one '# fitted:' line"
    if fitted[0].strip() != "none":
        assert fitted[0].split()[0] in raw, f"fitted parameter {fitted[0]!r} is not set in the file"
    assert prof.sources, "every profile names its sources"
    # every [tag] used in a comment is defined in `sources`
    defined = {m.group(1) for s in prof.sources for m in [re.match(r"\[([\w-]+)\]", s)] if m}
    used = set(re.findall(r"#.*?\[([\w-]+)\]", text))
    assert used <= defined, f"undefined source tags {used - defined}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_physically_consistent(name):
    p = load_profile(name)
    pk = p.peak_dense_tflops
    assert set(pk) == {"bf16", "fp16", "tf32", "fp32"}
    assert pk["bf16"] == pk["fp16"] > pk["tf32"] > pk["fp32"] > 0
    for curve in (p.matmul_efficiency_curve, p.attention_efficiency_curve):
        xs = [x for x, _ in curve]
        ys = [y for _, y in curve]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        assert all(0 < y <= 1 for y in ys)
        assert ys == sorted(ys), "efficiency must not fall as the problem grows"
    assert 0 < p.memory_reserve_gbytes < 0.1 * p.hbm_gbytes
    assert p.nvlink.gbytes_per_s > p.inter_node.gbytes_per_s > p.host_link_gbytes_per_s / 2
    assert p.nvlink.latency_s < p.inter_node.latency_s


def test_h100_curve_is_the_measured_one():
    """The TOML holds what build_h100_curve.py derives from benchmarks/reference/h100_gemm.json."""
    build = _build_module()
    ref = build.load_reference()
    p = load_profile("h100-sxm-80gb")
    assert 8 <= len(p.matmul_efficiency_curve) <= 12
    # spot-check one bin by hand: the largest bin is the median of measured efficiencies of big GEMMs,
    # all of which lie between 0.6 and 0.8 of 989.4 TFLOP/s in the reference file
    assert 0.6 < p.matmul_efficiency_curve[-1][1] < 0.8
    assert p.hbm_efficiency == pytest.approx(3012.3 / 3350, abs=1e-4)
    flat = [v for point in p.attention_efficiency_curve for v in point]
    assert flat == pytest.approx([2048, 343.005457 / 989.4, 4096, 445.219319 / 989.4, 8192, 521.591084 / 989.4], abs=1e-4)
    # the fit-error comment matches a fresh computation
    c = build.curves_for("h100-sxm-80gb", ref)
    text = (PROFILE_DIR / "h100-sxm-80gb.toml").read_text()
    m = re.search(r"median ([\d.]+)%, max ([\d.]+)%", text)
    assert m, "fit error comment missing"
    assert float(m.group(1)) == pytest.approx(100 * c["h100_fit_median"], abs=0.05)
    assert float(m.group(2)) == pytest.approx(100 * c["h100_fit_max"], abs=0.05)
    assert c["h100_fit_median"] < 0.10


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_generated_blocks_up_to_date(name):
    build = _build_module()
    c = build.curves_for(name, build.load_reference())
    p = load_profile(name)
    assert len(p.matmul_efficiency_curve) == len(c["matmul"])
    for (x, y), (xe, ye) in zip(p.matmul_efficiency_curve, c["matmul"]):
        assert x == pytest.approx(xe, rel=1e-5) and y == pytest.approx(ye, abs=1e-4)
    assert len(p.attention_efficiency_curve) == len(c["attention"])
    for (x, y), (xe, ye) in zip(p.attention_efficiency_curve, c["attention"]):
        assert x == pytest.approx(xe) and y == pytest.approx(ye, abs=1e-4)


def test_scaled_curve_follows_peak_and_ceiling():
    """A100: same overhead share at 312/989.4 of the GFLOP; ceiling ratio 0.869/0.803 (MAMF table)."""
    h = load_profile("h100-sxm-80gb").matmul_efficiency_curve
    a = load_profile("a100-sxm-80gb").matmul_efficiency_curve
    assert len(h) == len(a)
    for (xh, yh), (xa, ya) in zip(h, a):
        assert xa == pytest.approx(xh * 312 / 989.4, rel=1e-4)
        assert ya == pytest.approx(yh * 0.869 / 0.803, abs=2e-4)


def test_unknown_name_lists_available():
    with pytest.raises(ValueError) as e:
        load_profile("h100-sxm-8gb")
    msg = str(e.value)
    assert "h100-sxm-8gb" in msg and "h100-sxm-80gb" in msg and "mi300x" in msg


def test_load_by_path_toml_and_json(tmp_path):
    src = PROFILE_DIR / "a100-sxm-80gb.toml"
    assert load_profile(str(src)).name == "a100-sxm-80gb"
    data = tomllib.loads(src.read_text())
    data["name"] = "my-cluster"
    data["inter_node"]["gbytes_per_s"] = 12.5
    j = tmp_path / "mine.json"
    j.write_text(json.dumps(data))
    p = load_profile(j)
    assert p.name == "my-cluster" and p.inter_node.gbytes_per_s == 12.5


def _broken(tmp_path, mutate, suffix=".toml"):
    data = tomllib.loads((PROFILE_DIR / "h100-sxm-80gb.toml").read_text())
    mutate(data)
    path = tmp_path / f"broken{suffix}"
    path.write_text(json.dumps(data))  # JSON is the easy way to write it; suffix decides the parser
    return path


def test_missing_field_names_file_and_field(tmp_path):
    path = _broken(tmp_path, lambda d: d.pop("hbm_gbytes"), ".json")
    with pytest.raises(ValueError) as e:
        load_profile(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "hbm_gbytes" in msg


def test_bad_nested_value_names_field(tmp_path):
    def mutate(d):
        d["nvlink"]["efficiency"] = 1.7
    path = _broken(tmp_path, mutate, ".json")
    with pytest.raises(ValueError, match=r"nvlink\.efficiency"):
        load_profile(path)


def test_misspelt_field(tmp_path):
    def mutate(d):
        d["hbm_gbyte_per_s"] = d.pop("hbm_gbytes_per_s")
    path = _broken(tmp_path, mutate, ".json")
    with pytest.raises(ValueError) as e:
        load_profile(path)
    assert "hbm_gbyte_per_s" in str(e.value) and "unknown field" in str(e.value)


def test_malformed_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("name = 'x'\npeak_dense_tflops = {bf16 = }\n")
    with pytest.raises(ValueError) as e:
        load_profile(path)
    assert str(path) in str(e.value) and "TOML" in str(e.value) and "\n" not in str(e.value)


def test_missing_file():
    with pytest.raises(ValueError, match="does not exist"):
        load_profile("/nonexistent/cluster.toml")


def test_loader_does_not_import_torch():
    code = ("import sys, hardware_profiles; hardware_profiles.load_profile('h100-sxm-80gb'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_profiles_ship_as_package_data():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "*.toml" in pyproject["tool"]["setuptools"]["package-data"]["hardware_profiles"]
    assert Path(hardware_profiles.__file__).parent == PROFILE_DIR
