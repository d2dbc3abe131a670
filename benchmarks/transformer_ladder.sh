#!/usr/bin/env bash
# How the transformer study's ℓ_low was chosen: static levels of each family against
# uncompressed, AdamW + cosine, fp32, 2 Gloo ranks, the study's run length.
#   bash benchmarks/transformer_ladder.sh [SEEDS...]   (default: 0)
# Records: benchmarks/results/study/stdlib-transformer-ladder/RUN/seedK.jsonl; the summary
# (mean ± std of the final validation loss, bytes) is printed and written beside them.
set -euo pipefail
cd "$(dirname "$0")/../examples"
out=../benchmarks/results/study/stdlib-transformer-ladder
export OMP_NUM_THREADS=1 HOROVOD_CYCLE_TIME=0.2 PATH="$(dirname "$(command -v python)"):$PATH"
runs=("none:--compression none" "powersgd-32:--compression powersgd --levels 32 32"
      "powersgd-16:--compression powersgd --levels 16 16" "powersgd-8:--compression powersgd --levels 8 8"
      "powersgd-4:--compression powersgd --levels 4 4" "topk-0.5:--compression topk --levels 0.5 0.5"
      "topk-0.25:--compression topk --levels 0.25 0.25" "topk-0.1:--compression topk --levels 0.1 0.1")
for seed in "${@:-0}"; do
  for run in "${runs[@]}"; do
    name=${run%%:*}; mkdir -p "$out/$name"
    [ -s "$out/$name/seed$seed.jsonl" ] && tail -1 "$out/$name/seed$seed.jsonl" | grep -q '"done"' && continue
    horovodrun -np 2 --gloo python transformer_lm.py --batch-size 16 --seed "$seed" --no-progress \
      --record "$out/$name/seed$seed.jsonl" ${run#*:} > "$out/$name/seed$seed.out" 2>&1
  done
done
python - "$out" "${@:-0}" <<'PY'
import json, pathlib, statistics, sys
out, seeds = pathlib.Path(sys.argv[1]), sys.argv[2:]
summary = {}
for run in sorted(p for p in out.iterdir() if p.is_dir()):
    done = [json.loads((run / f"seed{seed}.jsonl").read_text().splitlines()[-1]) for seed in seeds]
    losses = [d["validation_loss"] for d in done]
    summary[run.name] = {"seeds": len(losses), "validation_loss_mean": round(statistics.mean(losses), 4),
                         "validation_loss_std": round(statistics.stdev(losses), 4) if len(losses) > 1 else 0.0,
                         "bytes_per_rank_mean": statistics.mean(d["bytes_sent_per_rank"] for d in done)}
    print(run.name, summary[run.name])
(out / "summary.json").write_text(json.dumps({"command": "bash benchmarks/transformer_ladder.sh " + " ".join(sys.argv[2:]),
                                              "runs": summary}, indent=1) + "\n")
PY
