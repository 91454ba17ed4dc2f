#!/usr/bin/env bash
# bench/train.py on a GPU machine, one command from a fresh clone: the Makefile takes the CUDA torch
# wheel when nvidia-smi is present, and the learner defaults to train.device=auto (cuda) and
# train.precision=auto (bf16 forwards, fp32 logprobs). Prints the bench's figures, the GPU last.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
make venv
mkdir -p .tracerl
.venv/bin/python bench/train.py
