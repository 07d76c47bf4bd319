"""The runtime that `parplan launch` runs (imports torch; the planner never imports it).

mesh.py           ParallelDims and the (dp, pp, [cp,] tp) DeviceMesh, TP innermost
mappings.py       conjugate autograd pairs for TP/SP regions (Megatron mappings.py style)
layers.py         column/row-parallel linear, vocab-parallel embedding and cross-entropy
model.py          llama/gpt pipeline-stage modules, logical-seeded init, recompute
pipeline.py       virtual-stage layout and torch.distributed.pipelining schedules
data_parallel.py  ZeRO 0-2 gradient reduction / sharded AdamW, FSDP2, tied and SP grad sums
data.py           deterministic synthetic or memmapped token batches
checkpoint.py     torch.distributed.checkpoint save/resume
checkpoint_steps.py  which steps a checkpoint folder holds (no torch: launch's pre-flight reads it too)
train.py          the torchrun entry and the run report
telemetry.py      nvidia-smi's SM clock, power and temperature per step (rank 0; no torch)
"""
