#!/bin/bash
# parplan's exports fed to the frameworks' own config parsers, on CPU, no training (2026-12-03: README.md here).
# Needs the frameworks, which parplan does not depend on: a work folder W with a venv holding torch, parplan
# (editable, this checkout), deepspeed (DS_BUILD_OPS=0) and megatron-core, and torchtitan releases unpacked
# without their dependencies (pip install --no-deps --target $W/tt-0.1.0 torchtitan==0.1.0; likewise 0.2.2):
#
#     W=/tmp/parplan-export-parse; python3 -m venv $W/venv
#     $W/venv/bin/pip install torch==2.13.0 -e . megatron-core==0.16.1 && DS_BUILD_OPS=0 $W/venv/bin/pip install deepspeed==0.19.8
#     $W/venv/bin/pip install --no-deps --target $W/tt-0.1.0 torchtitan==0.1.0   # 0.2.2 also wants triton
#     EXPORT_PARSE_DIR=$W bash benchmarks/export_parse/run_all.sh benchmarks/results/DATE-export-parse
set -u
W=${EXPORT_PARSE_DIR:-/tmp/parplan-export-parse}; export EXPORT_PARSE_DIR=$W
R=${1:?give the results folder}; mkdir -p "$R" "$W/plans" "$W/exports"
P=$W/venv/bin/python
# twelve representative plans: layouts, ZeRO stages, offload, interleaving, context parallelism, uneven stages
mk() { name=$1; shift; $P -m planner.cli recommend "$@" --json > "$W/plans/$name.json" 2> "$W/plans/$name.err"; echo "$name rc=$?"; }
mk p1_llama3_8b_8gpu          -m llama3-8b --gpus 8 --tokens 1e9
mk p2_llama3_70b_64_tp8       -m llama3-70b --gpus 64 --tp 8 --tokens 1e10
mk p3_llama3_70b_pp_vpp       -m llama3-70b --gpus 64 --tp 4 --pp 4 --vpp 5 --schedule interleaved-1f1b
mk p4_llama3_8b_zero3         -m llama3-8b --gpus 16 --zero 3 --tp 1 --pp 1 --tokens 1e9
mk p5_ds_zero1                -m llama3-8b --gpus 8 --framework deepspeed --zero 1 --tp 1 --pp 1
mk p6_ds_zero2_offload        -m llama3-8b --gpus 8 --framework deepspeed --zero 2 --offload optimizer --tp 1 --pp 1
mk p7_ds_zero3_offload        -m llama3-70b --gpus 16 --framework deepspeed --zero 3 --offload optimizer --tp 1 --pp 1
mk p8_gpt3_175b_128           -m gpt3-175b --gpus 128 --seq-len 2048 --global-batch-size 1536
mk p9_llama3_8b_cp4           -m llama3-8b --gpus 16 --cp 4 --seq-len 32768 --global-batch-size 64
mk p10_gpt2_fsdp              -m gpt2-medium --gpus 8 --framework fsdp --seq-len 1024 --global-batch-size 256
mk p11_qwen3_8b_uneven_pp     -m qwen3-8b --gpus 32 --pp 8 --tp 2 --framework megatron
mk p12_ds_pp_zero1_tp         -m llama3-70b --gpus 64 --framework deepspeed --tp 4 --pp 4 --zero 1
for f in "$W"/plans/*.json; do n=$(basename "$f" .json)
  for to in megatron torchtitan deepspeed; do
    ext=$(case $to in megatron) echo sh;; torchtitan) echo toml;; deepspeed) echo json;; esac)
    $P -m planner.cli export "$f" --to $to > "$W/exports/$n.$to.$ext" 2> "$W/exports/$n.$to.err"
  done
  mkdir -p "$W/v02/exports"; ln -sfn "$W/plans" "$W/v02/plans"  # --to torchtitan-0.2, as tt_check.py reads them
  $P -m planner.cli export "$f" --to torchtitan-0.2 > "$W/v02/exports/$n.torchtitan.toml" 2> "$W/v02/exports/$n.torchtitan.err"
done
D=benchmarks/export_parse
DS_ACCELERATOR=cpu $P $D/ds_check.py > "$R/deepspeed.txt" 2>&1
PYTHONPATH=$W/tt-0.1.0 $P $D/tt_check.py > "$R/torchtitan-0.1.0.txt" 2>&1
for m in "" --adapt-keep-split --adapt; do
  PYTHONPATH=$W/tt-0.2.2 $P $D/tt_check.py $m > "$R/torchtitan-0.2.2${m:-raw}.txt" 2>&1
done
EXPORT_PARSE_DIR=$W/v02 PYTHONPATH=$W/tt-0.2.2 $P $D/tt_check.py > "$R/torchtitan-0.2.2-as-exported-0.2.txt" 2>&1
# Megatron: no package ships Megatron-LM's arguments.py, and its transcribed argparse/validate_args lines are not kept
# here (Megatron-LM's source; README.md here): results/2026-12-03-export-parse/megatron.txt is the one run's output
tail -n 3 "$R"/*.txt
