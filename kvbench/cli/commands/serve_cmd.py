"""`kvbench serve`: run our engine's OpenAI-compatible server in the foreground."""

from __future__ import annotations


def register(commands, formatter) -> None:
    from kvbench.engines.kvengine.server.main import add_arguments, serve

    parser = commands.add_parser(
        "serve",
        help="serve our engine (OpenAI-compatible HTTP)",
        formatter_class=formatter,
        description="Serve kvbench's own engine: a Llama-family model on a paged (optionally FP8) KV cache.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=serve)
