"""parallel_layers.outside_graphs: the runtime's eager-only functions are marked without importing torch.compile's
machinery, and become graph breaks (torch.compiler.disable) once anything is compiled."""
from __future__ import annotations

import subprocess
import sys
import types

from parallel_layers import dropout, layers, model
from parallel_layers.outside_graphs import _MARKED, before_compiling, outside_graphs
from tests.runtime_helpers.suite import REPO

# the runtime's functions that must run outside compiled graphs: the fused weight-gradient GEMM's linears, the keyed
# hidden dropout and the attention dropout (host-side seeding), MLA's rebuilt up projections (saved-tensor hooks)
RUNTIME = ((layers, "_apply_eager"), (dropout, "_hidden_dropout"), (model, "_dropout_attention"),
           (model.MLAttention, "_attend_rebuilding_up"))


@outside_graphs
def _host_side(x):
    return x + 1


def test_importing_the_runtime_compiles_nothing_and_loads_no_checkpoint_code():
    """A run without torch.compile or checkpoints no longer pays for their imports (torch._inductor's compiler and
    torch.distributed.checkpoint: 1.3 s of every rank's start on this 2-core machine, 2026-12-06), and the marked
    functions are still the plain ones there."""
    where = lambda o: o.__name__ if isinstance(o, types.ModuleType) else f"{o.__module__}.{o.__qualname__}"
    names = ", ".join(f"{where(owner)}.{name}" for owner, name in RUNTIME)
    code = ("import sys, torch\nimport parallel_layers.train, parallel_layers.dropout, parallel_layers.layers, "
            "parallel_layers.model\n"
            "print([m for m in ('torch._inductor.compile_fx', 'torch.distributed.checkpoint') if m in sys.modules])\n"
            f"print([hasattr(f, '__wrapped__') for f in ({names},)])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "[False, False, False, False]"], out


def test_before_compiling_wraps_every_marked_function_where_it_is_defined():
    originals = {(owner, name): vars(owner)[name] for owner, name in RUNTIME}
    assert all(getattr(fn, "__wrapped__", fn) in _MARKED for fn in originals.values())
    before_compiling()
    before_compiling()  # idempotent: wrapped once
    for (owner, name), fn in originals.items():
        got = vars(owner)[name]
        assert getattr(got, "__wrapped__", None) is getattr(fn, "__wrapped__", fn), (owner, name)


def test_a_marked_function_breaks_the_graph_of_compiled_code():
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    before_compiling()
    torch._dynamo.reset()
    counters.clear()
    x = torch.ones(3)
    assert torch.equal(torch.compile(lambda t: _host_side(t * 2) * 3)(x), (x * 2 + 1) * 3)
    assert any("torch.compiler.disable" in k for k in counters["graph_break"]), dict(counters["graph_break"])
