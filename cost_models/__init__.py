"""Analytical cost model: pure functions (no torch) over scalars or numpy arrays.

params      parameter counts and FLOPs per token (Narayanan 2021 eq. 2-3, Korthikanti 2022 eq. 7-8)
memory      bytes per GPU on the worst pipeline stage
compute     matmul / attention / memory-bound kernel time with efficiency curves
comm        alpha-beta collective time per network tier
total       the whole step: bubble, overlap, MFU/HFU, Amdahl
zero3       DeepSpeed ZeRO-3's one-weight-ahead gathers and their memory
layout      the inputs: model dimensions, training constants, layouts (scalars or arrays of candidates)
hardware    a hardware profile converted to SI units, with its efficiency curves
"""
