#!/usr/bin/env bash
# Peer benchmark on the CPU (docs/performance.md): our release `florence2` CLI on its CPU backend beside
# ONNX Runtime CPU (fp32, int8, int4) and PyTorch CPU fp32, side by side in one run, phase by phase, with
# the greedy token ids compared. Details: the header of scripts/bench/peer.py.
#
#   PEER_TOKENIZER=/path/to/florence2/tokenizer.json \
#   PEER_EXPORTER=/path/to/export_florence2_onnx.py scripts/bench/peer.sh [peer.py options]
#
# PEER_EXPORTER is an external tool that writes the four ONNX graphs transformers.js loads (it is not part
# of this repository). Makes once: a Python environment with torch, transformers, onnx and onnxruntime in
# target/bench-venv (PEER_VENV), the release CLI, and under target/bench-peer/ the base-shaped random
# checkpoint and its ONNX graphs (about 1 GB each; delete the folder to make them again).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
: "${PEER_TOKENIZER:?set PEER_TOKENIZER to a Florence-2 tokenizer.json}"
: "${PEER_EXPORTER:?set PEER_EXPORTER to export_florence2_onnx.py}"
VENV=${PEER_VENV:-target/bench-venv}
if ! "$VENV/bin/python" -c "import torch, transformers, onnx, onnx_ir, onnxruntime, tokenizers, PIL" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch transformers onnx onnx-ir onnxruntime tokenizers pillow numpy safetensors
fi
# A release build only: a debug build is many times slower and says nothing about the engine.
cargo build --release --bin florence2
exec "$VENV/bin/python" scripts/bench/peer.py --tokenizer "$PEER_TOKENIZER" --exporter "$PEER_EXPORTER" "$@"
