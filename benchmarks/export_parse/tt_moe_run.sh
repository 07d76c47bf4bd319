#!/bin/bash
# parplan's torchtitan exports of mixtures of experts fed to torchtitan 0.2.2's own code on CPU (tt_moe_check.py; no
# training).  Needs a venv with torch and parplan's dependencies plus torchtitan 0.2.2 unpacked without its
# dependencies and what its imports ask (tyro, tokenizers, torchdata, tensorboard, datasets):
#
#     W=/tmp/parplan-export-parse-moe; python3 -m venv $W/venv
#     $W/venv/bin/pip install torch==2.13.0 -e . tyro tokenizers torchdata tensorboard datasets
#     $W/venv/bin/pip install --no-deps --target $W/tt-0.2.2 torchtitan==0.2.2
#     EXPORT_PARSE_DIR=$W bash benchmarks/export_parse/tt_moe_run.sh benchmarks/results/DATE-export-parse-moe
set -u
W=${EXPORT_PARSE_DIR:-/tmp/parplan-export-parse-moe}; export EXPORT_PARSE_DIR=$W
R=${1:?give the results folder}; mkdir -p "$R" "$W/plans" "$W/exports"
P=$W/venv/bin/python
# thirteen plans under --framework torchtitan: built-in flavors (qwen3, llama4, gpt_oss, deepseek_v3) and registered
# ones (Mixtral, Kimi K2), pipelines, hybrid sharding, ep above and below tp, DeepEP, latent attention
mk() { name=$1; shift; $P -m planner.cli recommend "$@" --framework torchtitan --json > "$W/plans/$name.json" 2> "$W/plans/$name.err"; echo "$name rc=$?"; }
mk m1_qwen3_30b_16_pp2      -m qwen3-30b-a3b --gpus 16 --pp 2
mk m2_qwen3_235b_256        -m qwen3-235b-a22b --gpus 256 --pp 1
mk m3_llama4_scout_64       -m llama4-scout --gpus 64
mk m4_mixtral_64_pp1        -m mixtral-8x7b --gpus 64 --pp 1
mk m5_qwen3_30b_hsdp        -m qwen3-30b-a3b --gpus 16 --dp-replicate 2
mk m6_gptoss_120b_64        -m gpt-oss-120b --gpus 64 --pp 1
mk m7_llama4_maverick_128   -m llama4-maverick --gpus 128
mk m8_mixtral_16_tp2_deepep -m mixtral-8x7b --gpus 16 --tp 2 --ep 4 --pp 1 --moe-dispatcher deepep
mk m9_qwen3_30b_tp4_ep2     -m qwen3-30b-a3b --gpus 32 --tp 4 --ep 2 --pp 1 --seq-len 8192
# multi-head latent attention: torchtitan's deepseek_v3 flavors (16B, 671B) and a registered one (Kimi K2)
mk m10_dsv2_lite_16_tp2     -m deepseek-v2-lite --gpus 16 --pp 1 --tp 2
mk m11_dsv3_1024            -m deepseek-v3 --gpus 1024 --pp 1
mk m12_kimi_k2_1024         -m kimi-k2 --gpus 1024 --pp 1
mk m13_dsv3_1024_pp         -m deepseek-v3 --gpus 1024
for f in "$W"/plans/*.json; do n=$(basename "$f" .json)
  $P -m planner.cli export "$f" --to torchtitan-0.2 > "$W/exports/$n.torchtitan.toml" 2> "$W/exports/$n.torchtitan.err"
  echo "$n export rc=$?"
done
PYTHONPATH=$W/tt-0.2.2 $P benchmarks/export_parse/tt_moe_check.py 2>&1 | grep -v '^\[rank' > "$R/torchtitan-0.2.2-moe.txt"
tail -n 5 "$R/torchtitan-0.2.2-moe.txt"
