#!/usr/bin/env bash
# Engine prefill + decode through `specd generate` (the path the stopped-prefill change touches):
# alternated rounds of the baseline binary ($1) and the new one ($2), 2 threads, trained F32 target.
set -euo pipefail
m=${MODEL:-$(dirname "$0")/../../shared/models/qwen35-code-target-f32.gguf}
prompt=$(python3 -c "
s=''
i=0
while len(s)<3000:
    s+=f'def f{i}(x, y):\n    z = x * {i} + y\n    return z - {i%7}\n\n'; i+=1
print(s)")
for r in 1 2 3; do
  for b in "$1" "$2"; do
    echo -n "$b round $r: "
    "$b" generate -m $m -t 2 -c 4096 --spec-type none -n 64 --json -p "$prompt" 2>/dev/null \
      | python3 -c "import json,sys; t=json.load(sys.stdin)['timings']; print({k:round(v,1) for k,v in t.items() if 'per_second' in k or k.endswith('_n')})"
  done
done
