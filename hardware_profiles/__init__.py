"""Hardware profiles: one TOML file per GPU system in this package, plus a loader.

``list_profiles()`` names the shipped profiles; ``load_profile(name_or_path)`` returns a validated
``planner.schema.HardwareProfile`` from a shipped name or from a user's own .toml/.json file.
Every error is a ``ValueError`` with one readable line (the file, the field, what is wrong).
Only the standard library and pydantic are imported here, so `parplan` starts fast.
"""
from __future__ import annotations

import json
import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
    import tomli as tomllib
from functools import lru_cache
from pathlib import Path

PROFILE_DIR = Path(__file__).resolve().parent
_SUFFIXES = (".toml", ".json")


def list_profiles() -> list[str]:
    """Names of the profiles shipped in this package, sorted (the folder listed once a process: `validate --hardware
    b200` had listed it some 8,700 times, 2.4 s of its run)."""
    return list(_shipped_names())


@lru_cache(maxsize=1)
def _shipped_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))


def looks_like_path(name_or_path: str | Path) -> bool:
    """A path (a Path, a .toml/.json name, or one with a separator), else a shipped profile's name."""
    s = str(name_or_path)
    return isinstance(name_or_path, Path) or s.endswith(_SUFFIXES) or "/" in s or "\\" in s


def _read_bytes(path: Path) -> bytes:
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as e:  # a name too long, a folder on the way that cannot be entered
        raise ValueError(f"hardware profile {path}: cannot read it: {e.strerror or e}") from None
    if is_dir:
        raise ValueError(f"hardware profile {path} is a folder; give a .toml/.json file in it, or a profile name "
                         f"({', '.join(list_profiles())})")
    if not is_file and path.exists():  # a device (/dev/zero) or a pipe: not a profile file
        raise ValueError(f"hardware profile {path} is not a regular file; give a .toml/.json file, or a profile name "
                         f"({', '.join(list_profiles())})")
    if not is_file:
        raise ValueError(f"hardware profile file {path} does not exist; give a profile name "
                         f"({', '.join(list_profiles())}) or a path to a .toml/.json file (`parplan calibrate --out` "
                         "writes one)")
    if path.suffix not in _SUFFIXES:
        raise ValueError(f"hardware profile {path}: expected a .toml or .json file")
    try:
        return path.read_bytes()
    except OSError as e:
        raise ValueError(f"hardware profile {path}: cannot read it: {e.strerror or e}") from None


def _parse(path: Path, raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8-sig")  # an editor's byte order mark is still UTF-8
    except UnicodeDecodeError as e:
        raise ValueError(f"hardware profile {path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         "save it as UTF-8") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"hardware profile {path}: not valid {path.suffix[1:].upper()}: {e}") from None
    except RecursionError:
        raise ValueError(f"hardware profile {path}: not valid {path.suffix[1:].upper()}: nested too deeply") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ValueError(f"hardware profile {path}: not valid {path.suffix[1:].upper()}: a number in it has more "
                         "digits than can be read") from None
    if not isinstance(data, dict):
        raise ValueError(f"hardware profile {path}: top level must be a table/object, got {type(data).__name__}")
    return data


def _one_line(path: Path, err, model) -> str:
    """First pydantic error as 'file: field a.b: message' (+ how many more); unknown keys first,
    with the closest known field name, since a misspelt key also shows up as a missing one."""
    import difflib

    from planner.schema import error_message

    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
    msg = error_message(first)
    if first["type"] == "finite_number":
        msg = "must be a finite number, not inf or nan"
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(first["loc"][-1]), list(model.model_fields), n=1)
        msg = "unknown field" + (f" (did you mean {close[0]}?)" if close else "")
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    key = first["loc"][-2] if len(first["loc"]) == 3 and first["loc"][-1] == "[key]" else None
    if key is not None and key in model.model_fields:  # a top-level field written below a [table] header: TOML
        # puts every key after the header into that table ("field host_block_s.memory_reserve_gbytes.[key]: ...")
        table = first["loc"][0]
        return (f"hardware profile {path}: {key} is read as a key of the [{table}] table (TOML puts every key below a "
                f"header into its table; there: {msg}); move {key} above the [{table}] header{more}")
    return f"hardware profile {path}: field {loc}: {msg}{more}"


def find_upward(name: str, folder: str | Path) -> Path | None:
    """A relative profile path as a plan or report records it (relative to where recommend or launch ran), looked
    for in `folder` (the plan's or report's own) and the folders above it: plans sit in runs/<time>/ or
    benchmarks/results/... of the folder they were made in.  The file as seen from here (relative to the current
    folder where it is under it); None for a shipped name, an absolute path, or nowhere."""
    if not looks_like_path(name) or Path(name).is_absolute():
        return None
    start = Path(folder).resolve()
    found = next((d / name for d in (start, *start.parents) if (d / name).is_file()), None)
    if found is None:
        return None
    try:
        return found.relative_to(Path.cwd())
    except ValueError:
        return found


def canonical_name(name_or_path):
    """A shipped profile's name as list_profiles() spells it where the given one differs only in case ("H100-SXM-80GB",
    as model presets are matched) or is the GPU's name alone and one profile has it, or one SXM profile among its
    others ("GB200"; "h100": h100-sxm-80gb, not h100-pcie-80gb or h100-nvl-94gb; "h800", "a800": their SXM parts, the
    only ones profiled; "h20": h20-96gb, not h200-sxm-141gb; "a100" names two SXM parts), also written with
    spaces or underscores and the maker's name before it, as nvidia-smi prints a GPU ("NVIDIA H100 PCIe",
    "h100_pcie": h100-pcie-80gb; "NVIDIA A100 80GB PCIe": a100-pcie-80gb; "NVIDIA H100 NVL": h100-nvl-94gb), or with
    its memory after a one-word name: the GPU's one profile of that memory ("NVIDIA GH200 144G HBM3e": gh200-144gb;
    "H20 141GB": h20-3e-141gb), else the GPU's name alone ("NVIDIA GH200 480GB", its Grace's memory: gh200-96gb).
    A GPU's name alone where its profiles named the GPU and a memory size are several, or one among others: the
    smallest ("h20": h20-96gb, not h20-3e-141gb, as nvidia-smi prints "NVIDIA H20" and "NVIDIA H20-3e"; "gh200":
    gh200-96gb, the HBM3 part, as the HBM3e one's name says "144G HBM3e"); a device's whole name otherwise as
    calibrate reads it ("NVIDIA H100 80GB HBM3": h100-sxm-80gb; "NVIDIA A100-SXM4-40GB": a100-sxm-40gb); anything else
    as given."""
    if looks_like_path(name_or_path):
        return name_or_path
    names = list_profiles()
    if name_or_path in names:
        return name_or_path
    key = str(name_or_path).strip().lower()
    spelled = spelled_gpu_name(key)
    # a one-word GPU name with its memory after it, as nvidia-smi prints the GH200s ("gh200-480gb", "gh200-144g-hbm3e"):
    # the profile of that memory where there is one, else the name alone
    sized = re.fullmatch(r"([a-z0-9]+)-(\d+)g(?:b)?(?:-hbm\w*)?", spelled)
    bare = sized.group(1) if sized else spelled
    if sized:  # "NVIDIA H20 141GB": h20-3e-141gb, the one H20 of 141 GB
        of_size = [n for n in names if n.lower().startswith(bare + "-") and n.lower().endswith(f"-{sized.group(2)}gb")]
        if len(of_size) == 1:
            return of_size[0]
    for k in dict.fromkeys((key, spelled, bare)):
        exact = {n.lower(): n for n in names}.get(k)
        if exact:
            return exact
        kind = [n for n in names if n.lower().startswith(k + "-")] if k else []
        sxm = [n for n in kind if "-sxm-" in n.lower()]
        if len(kind) == 1 or len(sxm) == 1:
            return kind[0] if len(kind) == 1 else sxm[0]
        plain = [n for n in kind if re.fullmatch(re.escape(k) + r"-\d+gb", n.lower())]  # the GPU and its memory
        if plain:
            return min(plain, key=lambda n: int(re.findall(r"\d+", n)[-1]))
    # an SXM part's whole name as nvidia-smi prints it, its memory and kind of HBM beside the GPU's name ("NVIDIA H100
    # 80GB HBM3", "NVIDIA A100-SXM4-40GB"): the GPU's SXM profile of that memory, else of its name alone (a name
    # holding anything else, "NVIDIA H200 NVL", another card, is not one)
    parts = re.sub(r"^(nvidia|amd-instinct|amd)-", "", re.sub(r"[\s_]+", "-", key)).split("-")
    marks = [t for t in parts[1:] if re.fullmatch(r"\d+gb|hbm\w*|sxm\d*", t)]
    if marks and len(marks) == len(parts) - 1 and re.match(r"(nvidia|amd)[\s_-]", key):
        mem = next((t for t in marks if t.endswith("gb")), None)
        sxm = {n.lower(): n for n in names}.get(f"{parts[0]}-sxm-{mem}") if mem else None
        found = sxm or canonical_name(parts[0])
        if found in names:
            return found
    return name_or_path


def calibrated_on(profile) -> str:
    """The device a profile was measured on where `parplan calibrate` wrote it ("... -- calibrated on NVIDIA H100
    PCIe" ends its description; the last one, for a profile calibrated from a calibrated base), else ""."""
    described = profile.description or ""
    return described.rpartition("calibrated on ")[2] if "calibrated on " in described else ""


def spelled_gpu_name(name: str) -> str:
    """A GPU's name (a device's as nvidia-smi and torch print it, or a profile's) as the profiles spell one: lower case,
    hyphens for spaces and underscores, no maker's name first, no memory size before the form factor ("NVIDIA A100
    80GB PCIe": a100-pcie; "NVIDIA H100 PCIe": h100-pcie)."""
    key = re.sub(r"[\s_]+", "-", name.strip().lower())
    return re.sub(r"-\d+gb(?=-)", "", re.sub(r"^(nvidia|amd-instinct|amd)-", "", key))


def profile_file(name_or_path: str | Path) -> Path:
    """The file a profile name (a shipped profile) or path is read from."""
    return Path(name_or_path) if looks_like_path(name_or_path) else PROFILE_DIR / f"{name_or_path}.toml"


# Profiles already parsed and validated, by their file's suffix and bytes: `validate` plans 251 published runs
# over a handful of profiles, and parsing their TOML each time was a sixth of the command. The file is still
# read every time (microseconds), so an edit is always seen; callers get a deep copy, never the cached one.
_LOADED: dict = {}
_SHIPPED: dict = {}  # the shipped profiles read, by the same key: never dropped


class ProfileNote(UserWarning):
    """A value of a profile file far outside every shipped profile's (implausible_values): the CLI prints it as a
    note on stderr; the profile is used as written."""


# How far outside the shipped profiles' range (L40S .. GB300) a custom profile's value is called implausible: real parts
# span about that much, and the unit slips this catches move a value 1000x (TB for GB, GFLOP/s for TFLOP/s, MB/s for
# GB/s); a network given in Gb/s (8x) is caught by its NIC outrunning the node's own fabric instead
IMPLAUSIBLE_FACTOR = 10
# except the network between nodes, where 2x the fastest shipped NIC a GPU (100 GB/s, 800 Gb/s) is beyond any part: a
# NIC's Gb/s written as GB/s reads 8x its rate
IMPLAUSIBLE_FACTOR_BY_FIELD = {"inter_node.gbytes_per_s": 2}
# (field, its unit as the file writes it), the peaks by dtype as "peak_dense_tflops.<dtype>"
_CHECKED_VALUES = (("peak_dense_tflops", "TFLOP/s"), ("hbm_gbytes", "GB"), ("hbm_gbytes_per_s", "GB/s"),
                   ("nvlink.gbytes_per_s", "GB/s per GPU per direction"),
                   ("inter_node.gbytes_per_s", "GB/s per GPU per direction"), ("host_link_gbytes_per_s", "GB/s"),
                   ("host_memory_gbytes_per_node", "GB"), ("host_memory_gbytes_per_s_per_node", "GB/s"))


def _profile_values(profile) -> dict[str, float]:
    out = {}
    for field, _ in _CHECKED_VALUES:
        if field == "peak_dense_tflops":
            out.update({f"{field}.{k}": v for k, v in profile.peak_dense_tflops.items()})
        else:
            obj = profile
            for part in field.split("."):
                obj = getattr(obj, part)
            out[field] = obj
    return out


@lru_cache(maxsize=1)
def _shipped_ranges() -> dict[str, tuple]:
    """Each checked value's (smallest, its profile, largest, its profile) over the shipped profiles (read once)."""
    ranges: dict[str, tuple] = {}
    for name in list_profiles():
        for key, v in _profile_values(load_profile(name)).items():
            lo, lo_name, hi, hi_name = ranges.get(key, (v, name, v, name))
            ranges[key] = (min(lo, v), name if v < lo else lo_name, max(hi, v), name if v > hi else hi_name)
    return ranges


def implausible_values(profile) -> list[str]:
    """Sentences on the values of `profile` more than IMPLAUSIBLE_FACTOR x beyond every shipped profile's (a unit
    slip, most likely), and on a network between nodes faster a GPU than the node's own fabric (Gb/s written as
    GB/s); [] for the shipped profiles themselves (tests/test_profiles.py)."""
    units = dict(_CHECKED_VALUES)
    ranges = _shipped_ranges()
    notes = []
    for key, v in _profile_values(profile).items():
        if key not in ranges:  # a dtype no shipped profile lists
            continue
        lo, lo_name, hi, hi_name = ranges[key]
        unit = units[key.split(".")[0] if key.startswith("peak_dense_tflops") else key]
        over = IMPLAUSIBLE_FACTOR_BY_FIELD.get(key, IMPLAUSIBLE_FACTOR)
        if v > over * hi:
            notes.append(f"profile {profile.name}: {key} = {v:g} is over {over}x the largest shipped "
                         f"profile's ({hi_name}: {hi:g}); the unit is {unit}: check it")
        elif v < lo / IMPLAUSIBLE_FACTOR:
            notes.append(f"profile {profile.name}: {key} = {v:g} is under 1/{IMPLAUSIBLE_FACTOR} of the smallest "
                         f"shipped profile's ({lo_name}: {lo:g}); the unit is {unit}: check it")
    if profile.gpus_per_node > 1 and profile.inter_node.gbytes_per_s > profile.nvlink.gbytes_per_s:
        notes.append(f"profile {profile.name}: inter_node.gbytes_per_s = {profile.inter_node.gbytes_per_s:g} is faster "
                     f"a GPU than the node's own fabric (nvlink.gbytes_per_s = {profile.nvlink.gbytes_per_s:g}); both "
                     "are GB/s per GPU per direction (a 400 Gb/s NIC is 50 GB/s): check them")
    return notes


def load_profile(name_or_path: str | Path):
    """A shipped profile by name (see ``list_profiles()``) or a .toml/.json file by path."""
    from pydantic import ValidationError  # lazy: keep `import hardware_profiles` cheap

    from planner.schema import HardwareProfile

    name_or_path = canonical_name(name_or_path)
    path = profile_file(name_or_path)
    if not looks_like_path(name_or_path):
        if name_or_path not in list_profiles():  # a shipped name; no file-system lookup of an arbitrary string
            import difflib
            key = spelled_gpu_name(str(name_or_path))
            close = [] if not key else (  # every name starts with "": no guess for an empty one
                [p for p in list_profiles() if p.startswith(key)]
                or [p for p in list_profiles() if p.split("-")[0] == key.split("-")[0]]  # the GPU's other parts
                or difflib.get_close_matches(key, list_profiles(), n=1, cutoff=0.5))
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""  # a100: both of its profiles
            try:  # a file or folder of that name here: read as a profile name, as a bare word is
                here = Path(name_or_path)
                here = None if not key else "folder" if here.is_dir() else "file" if here.exists() else None
            except (OSError, ValueError):  # (an empty name is Path("."), the folder here: no hint about it)
                here = None
            if here:
                hint += (f" ({name_or_path} here is a {here}: a profile file is named .toml or .json, or given with "
                         f"a folder, ./{name_or_path})")
            shown = name_or_path if len(name_or_path) <= 60 else name_or_path[:60] + "..."
            raise ValueError(f"unknown hardware profile {shown!r}{hint}; available: {', '.join(list_profiles())}; "
                             "or give a .toml/.json file: for another GPU, `parplan hardware show h100-sxm-80gb > "
                             "my-gpu.json`, edited to its datasheet, or `parplan calibrate --out my-gpu.toml` on it")
    raw = _read_bytes(path)
    key = (path.suffix, raw)
    if key in _SHIPPED:
        return _SHIPPED[key].model_copy(deep=True)
    if key not in _LOADED:
        data = _parse(path, raw)
        if isinstance(data, dict) and "parallel" in data and "model" in data:  # `hardware show plan.json`
            hw = data.get("hardware")
            named = f"; its profile is {hw['name']}" if isinstance(hw, dict) and isinstance(hw.get("name"), str) else ""
            raise ValueError(f"hardware profile {path} is a plan, not a hardware profile{named}")
        try:
            profile = HardwareProfile(**data)
        except ValidationError as e:
            raise ValueError(_one_line(path, e, HardwareProfile)) from None
        if looks_like_path(name_or_path):  # a file of the user's: said once a process (the shipped ones are checked)
            import warnings
            for note in implausible_values(profile):
                warnings.warn(note, ProfileNote, stacklevel=2)
        if path.parent == PROFILE_DIR:  # a shipped profile: kept (21 of them; a run that read every one, as an error
            _SHIPPED[key] = profile     # naming those with a field does, had cycled the 16-file cache and parsed each
            return profile.model_copy(deep=True)  # again every time: 8,000 parses in `validate --hardware b200`)
        if len(_LOADED) >= 16:  # a session reads a few files; drop the oldest (an edited file's old version)
            del _LOADED[next(iter(_LOADED))]
        _LOADED[key] = profile
    return _LOADED[key].model_copy(deep=True)
