#!/bin/sh
# The runs behind BENCHMARKS.md (one process per prompt set; ratios are within a process).
# Usage: scripts/bench_all.sh [LIMIT] [OUTDIR]
set -eu
LIMIT=${1:-20}
OUT=${2:-bench-results}
mkdir -p "$OUT"
S=".venv/bin/speclab"
$S bench --target code-target --draft code-draft --prompts code-complete --limit "$LIMIT" --max-new-tokens 128 --whatif \
  --methods "ar,hf-greedy,draft-model[k=4],draft-model[k=3],hf-assisted,draft-model[threshold=0.5;max_k=8],draft-model[schedule=heuristic],layer-skip[exit_layer=auto],layer-skip[exit_layer=4],hf-early-exit,ar[record=none],draft-model[k=4;record=none]" \
  --json "$OUT/code-complete.json" --html "$OUT/code-complete.html" > "$OUT/code-complete.md"
$S bench --target code-target --draft code-draft --prompts code-complete --limit "$LIMIT" --max-new-tokens 128 \
  --methods "ar,draft-model[k=8],tree-static[paths=[[0],[1],[0,0],[0,1],[0,0,0],[0,0,1],[0,0,0,0],[0,0,0,0,0]]],tree-dynamic[budget=8;width=3],recycling[width=2;budget=8;k=4],recycling[k=8]" \
  --json "$OUT/trees.json" > "$OUT/trees.md"
$S bench --target code-target --draft code-draft --prompts code-edit --limit "$LIMIT" --max-new-tokens 128 \
  --methods "ar,hf-greedy,prompt-lookup[k=8],prompt-lookup[k=8;prefer=recent],prompt-lookup[k=16;max_ngram=5;grow=4],hf-prompt-lookup,suffix,recycling,lookahead,draft-model[k=4]" --k 8 \
  --json "$OUT/code-edit.json" --html "$OUT/code-edit.html" > "$OUT/code-edit.md"
