#!/usr/bin/env bash
# Traffic and accuracy of the small batch, the large batch and Accordion-batch on the
# embedded digits dataset, 2 Gloo ranks. Writes benchmarks/results/batch_switch_digits.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=1
out=benchmarks/results/batch_switch_digits.jsonl
: > "$out"
for mode in small large accordion; do
    command="horovodrun -np 2 --gloo python examples/pytorch_batch_switch.py --mode $mode --json"
    line=$($command 2>&1 | sed -n 's/^\[0\]<stdout>:\({.*}\)$/\1/p')
    python -c "import json,sys; d=json.loads(sys.argv[1]); d['command']=sys.argv[2]; print(json.dumps(d))" \
        "$line" "$command" >> "$out"
done
cat "$out"
