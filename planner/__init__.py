"""parplan planner: model/hardware/plan descriptions, the layout search and the CLI.

A small Python API mirrors the CLI (imported lazily so `parplan` starts fast):

    from planner import recommend, evaluate_plan, load_preset, Pins
    plan = recommend(load_preset("llama3-70b"), gpus=64)
    plan.parallel, plan.prediction.mfu

No module imports torch when it is imported (the planning commands never load it); `parplan launch` imports it
when it runs (its pre-flight checks, then the torchrun job) and `parplan calibrate` to measure.
"""
# sequences a step when none is given (recommend() and the CLI): 4M tokens at the default 4096-token sequence
DEFAULT_GLOBAL_BATCH = 1024
# tokens a sequence when none is given (recommend() and the CLI), where a learned position table is not shorter
DEFAULT_SEQ_LEN = 4096
# the AdamW that parplan's runtime trains with (parallel_layers/train.py) and the exports configure: Llama 3's and
# torchtitan's betas and weight decay (Megatron-LM's defaults are beta2 0.999 and weight decay 0.01, DeepSpeed's
# AdamW 0.999 and 0)
ADAMW_BETAS = (0.9, 0.95)
ADAMW_WEIGHT_DECAY = 0.1

__all__ = ["recommend", "evaluate_plan", "load_preset", "model_from_params", "Pins", "Plan", "ModelSpec",
           "NothingFits", "PlannerError"]

_WHERE = {"recommend": "core", "evaluate_plan": "core", "NothingFits": "core", "PlannerError": "core",
          "load_preset": "models", "model_from_params": "models", "Pins": "search", "Plan": "schema",
          "ModelSpec": "schema"}


def __getattr__(name):
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"planner.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
