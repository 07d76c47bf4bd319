#!/bin/bash
# parplan's partial-recompute plans under --framework torchtitan exported --to torchtitan-0.2 and fed to torchtitan
# 0.2.2's own apply_ac on CPU (tt_layer_sac_check.py; no training).  Needs a venv with torch 2.13.0 CPU and parplan's
# dependencies, torchtitan 0.2.2 (pip install --no-deps torchtitan==0.2.2) and what its imports ask (tyro, tokenizers,
# torchdata, tensorboard, datasets, einops, triton):
#     W=/tmp/ttp; bash benchmarks/export_parse/tt_layer_sac_run.sh benchmarks/results/DATE-export-parse-layer-sac
set -u
W=${EXPORT_PARSE_DIR:-/tmp/ttp}; P=$W/venv/bin/python
R=${1:?give the results folder}; mkdir -p "$R" "$W/sac"
mk() { name=$1; shift
  PYTHONPATH=. $P -m planner.cli recommend "$@" --framework torchtitan --json > "$W/sac/$name.json" 2> "$W/sac/$name.err"
  PYTHONPATH=. $P -m planner.cli export "$W/sac/$name.json" --to torchtitan-0.2 > "$W/sac/$name.toml" 2>> "$W/sac/$name.err"
  echo "$name rc=$?"; }
# the search's own choice (3 of 32 blocks, f 10); pinned counts on one stage a rank and under interleaving
mk s1_llama3_8b_8_searched     -m llama3-8b --gpus 8 --seq-len 8192
mk s2_llama3_8b_8_pp2_n4       -m llama3-8b --gpus 8 --seq-len 8192 --pp 2 --recompute-layers 4
mk s3_llama3_8b_16_pp2_vpp2_n2 -m llama3-8b --gpus 16 --seq-len 8192 --pp 2 --vpp 2 --schedule interleaved-1f1b --recompute-layers 2
mk s4_llama3_70b_32_pp4_n5     -m llama3-70b --gpus 32 --pp 4 --recompute-layers 5
mk s5_llama3_8b_8_n6           -m llama3-8b --gpus 8 --seq-len 8192 --pp 1 --recompute-layers 6
$P benchmarks/export_parse/tt_layer_sac_check.py "$W"/sac/*.toml 2>&1 | grep -v "^HF assets path" > "$R/torchtitan-0.2.2-layer-sac.txt"
cat "$R/torchtitan-0.2.2-layer-sac.txt"
