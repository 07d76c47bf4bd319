"""tests.runtime_helpers.held: the bytes a traced stretch leaves held, blind to blocks allocated before it."""
from __future__ import annotations


def test_a_block_from_an_earlier_trace_freed_inside_counts_nothing():
    """A block allocated under an earlier profile (so torch's CPU allocator knows its size) and freed inside the
    trace must not read as negative bytes held; what the trace allocates and keeps reads to the byte, what it
    allocates and frees reads zero."""
    import torch

    from tests.runtime_helpers.held import traced_cpu_memory
    with traced_cpu_memory():
        old = [torch.empty(8, dtype=torch.float32)]  # 32 bytes, its size known to the allocator from here on
    with traced_cpu_memory() as held:
        old.clear()  # freed inside the next trace
        kept = torch.empty(1000, dtype=torch.float64)
        torch.empty(500, dtype=torch.float64)  # freed at once
    assert held() == kept.untyped_storage().nbytes() == 8000
