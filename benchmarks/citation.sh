#!/usr/bin/env bash
# Citation benchmarks (Planetoid public split, 10 seeds each): the anchors (GCN, GAT), the main job's
# hybrid, the hybrid with consistency training (graphattn's best attention model), GRAND's random
# propagation, written to committed run
# folders under benchmarks/results/citation/ (config, results, summary, per-seed history; the
# checkpoints are ignored by git). Finished seeds are reused, so the script can be stopped and rerun.
#   bash benchmarks/citation.sh [cora|citeseer|pubmed ...]     # default: all three
#   graphattn table benchmarks/results/citation/*               # the table
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/citation
run() {  # run ... --out DIR: a new folder, or the finished seeds of an existing one reused
  local out="${*: -1}" extra=()
  [ -e "$out" ] && extra=(--resume)
  PATH="$PWD/.venv/bin:$PATH" graphattn run --threads 1 --no-progress "${extra[@]}" "$@"
}
tasks=("$@"); [ ${#tasks[@]} -gt 0 ] || tasks=(cora citeseer pubmed)
for t in "${tasks[@]}"; do
  run --config examples/configs/gcn_cora.toml --task "$t" --out "$OUT/$t-gcn"
  if [ "$t" = pubmed ]; then  # GAT's PubMed recipe: 8 output heads, lr 0.01, L2 0.001
    run --config examples/configs/gat_cora.toml --task "$t" --lr 0.01 --weight-decay 0.001 \
      --model-kwargs '{"out_heads": 8}' --out "$OUT/$t-gat"
  else
    run --config examples/configs/gat_cora.toml --task "$t" --out "$OUT/$t-gat"
  fi
  run --config examples/configs/cora.toml --task "$t" --seeds 0 1 2 3 4 5 6 7 8 9 \
    --out "$OUT/$t-hybrid"
  run --config examples/configs/cora_consistency.toml --task "$t" --out "$OUT/$t-consistency"
  run --config "examples/configs/grand_$t.toml" --out "$OUT/$t-grand"
done
