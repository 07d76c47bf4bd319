"""What transformers builds from each Hugging Face config tests/test_hf_config.py holds parplan's count against.

    python benchmarks/hf_family_counts.py      # needs torch and transformers (not parplan's dependencies)

For every config in the test's TRANSFORMERS_BUILT: `AutoConfig.for_model(**config)`, the model built on the meta device
(`AutoModelForCausalLM.from_config`, no memory), the sum of numel over `model.parameters()` (tied weights once), beside
the count the test records, parplan's count and their difference, and whether it is what the test says.  Run on
2026-12-04 with transformers 5.25.0 and torch 2.13.0 (CPU): all 23 as recorded.  Prints a table; exit 1 if a build
differs from the recorded count (a transformers release that builds a family otherwise).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    from planner.hf_config import model_from_hf_config
    from test_hf_config import TRANSFORMERS_BUILT

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"{'model_type':18s} {'built':>16s} {'recorded':>16s} {'parplan':>16s} {'parplan - built':>16s}  as the test says")
    differ = 0
    for cfg, recorded, parplan_more, _ in TRANSFORMERS_BUILT:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
        built = sum(p.numel() for p in model.parameters())
        ours = model_from_hf_config(cfg).num_params
        differ += built != recorded
        print(f"{cfg['model_type']:18s} {built:16,d} {recorded:16,d} {ours:16,d} {ours - built:+16,d}  "
              f"{'yes' if ours - built == parplan_more else 'NO'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
