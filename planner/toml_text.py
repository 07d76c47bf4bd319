"""TOML values as text, for the files parplan writes: calibrated hardware profiles (planner.calibrate) and torchtitan
job configs (planner.export).  Python's standard library reads TOML (tomllib) but writes none."""
from __future__ import annotations

import json
from typing import Any


def toml_value(v: Any) -> str:
    """One value as TOML: booleans, integers, floats (repr's shortest round-trip digits; inf, -inf and nan are
    TOML's own literals: torchtitan's max_norm = inf is no clipping; a hardware profile holds none, its schema
    refuses them), strings (basic strings, UTF-8), arrays and inline tables of those."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
