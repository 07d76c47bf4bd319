"""What a stretch of code leaves held on the CPU allocator, from torch.profiler's memory trace (profile_memory).

Only blocks allocated inside the trace and not freed inside it are counted.  Summing the trace's memory events
instead (``sum(e.cpu_memory_usage ...)``) also counts the frees of blocks allocated before it, whenever torch's CPU
allocator knows their size (it does for every block allocated while any earlier profile with profile_memory ran in
the process, e.g. an earlier test's on the same pytest worker): such a free, inside the trace, reads as the code
holding less than it does (CI once read a 32-byte block freed so, in tests/test_runtime_moe_recompute.py)."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def traced_cpu_memory():
    """``with traced_cpu_memory() as held: ...``, then ``held()``: the bytes allocated inside the block on the CPU
    and still live at its end."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    result = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield lambda: result["held"]
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr))
    live = {}
    for _, size, ptr in sorted(events, key=lambda e: e[0]):
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)  # a block allocated before the trace is not in it: its free changes nothing
    result["held"] = sum(live.values())
