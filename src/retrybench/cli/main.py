"""The `retrybench` command: the group, and the module that declares each of its commands.

A command's module is imported when the command runs or shows its help, never for `retrybench --help`,
which lists the summaries below: the command line starts in the time it takes to import click.
"""

from __future__ import annotations

import importlib

import click

from retrybench import __version__

__all__ = ["COMMANDS", "main"]

# name -> (the module declaring it, as the function named after it; its summary in `retrybench --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("retrybench.cli.runs", "Measure C-hat the paper's way, simulated or live."),
    "run": ("retrybench.cli.runs", "One paper run under one condition, simulated or live."),
    "block": ("retrybench.cli.runs", "Every condition of one Table 1 block."),
    "reproduce": ("retrybench.cli.reproduce", "Every block, then the reproducibility report."),
    "sweep": ("retrybench.cli.sweep", "Map run parameters x conditions x seeds."),
    "assess": ("retrybench.cli.assess", "Which control keeps your deployment up."),
    "proxy": ("retrybench.cli.live", "Serve the overload-control proxy."),
    "engine-server": ("retrybench.cli.live", "Serve the simulated engine over HTTP."),
    "loadgen": ("retrybench.cli.live", "Replay a trace against a target, retrying."),
    "make-trace": ("retrybench.cli.tools", "Write the paper's trace for loadgen to replay."),
    "doctor": ("retrybench.cli.tools", "Which engines can run here, and fixes for the rest."),
    "gpus": ("retrybench.cli.gpus", "The GPUs --gpu takes: memory, bandwidth, kernel data."),
    "compare-real-engine": ("retrybench.cli.realvllm", "The simulator against a real vLLM on CPUs."),
    "make-tiny-model": ("retrybench.cli.realvllm", "Write a tiny random-weight Llama for vLLM."),
}


class Commands(click.Group):
    """The group of COMMANDS, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), cmd_name.replace("-", "_"))
        assert isinstance(command, click.Command), f"{module} declares no command {cmd_name}"
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="retrybench")
def main() -> None:
    """Re-test 'Cancellation Is Not Enough' on a simulated vLLM-V1 engine (virtual time, CPU), or live
    through the overload-control proxy over real HTTP."""


if __name__ == "__main__":
    main()
