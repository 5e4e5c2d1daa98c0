"""The shared options: one name per setting, parsed into what the commands take, bad values refused
before anything loads."""

import click
import pytest
from click.testing import CliRunner

from fusionrag_llm.cli.bench import _question_range
from fusionrag_llm.cli.main import cli


def _options(group: click.Group, ctx: click.Context):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield from (p for p in command.params if isinstance(p, click.Option))
        if isinstance(command, click.Group):
            yield from _options(command, ctx)


def test_the_commands_share_at_most_40_option_names():
    ctx = click.Context(cli)
    names = {param.opts[-1] for param in [*cli.params, *_options(cli, ctx)] if "--help" not in param.opts}
    assert len(names) <= 40, sorted(names)


@pytest.mark.parametrize(("value", "expected"), [(None, (0, None)), ("20", (0, 20)), ("31-60", (30, 30)), ("5-5", (4, 1))])
def test_questions_are_a_count_or_a_range(value, expected):
    assert _question_range(None, None, value) == expected


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "quality", "--questions", "60-31"],
        ["bench", "quality", "--questions", "0"],
        ["bench", "quality", "--engine-option", "craft_variants=2"],  # a run's identity knows kv_codec only
        ["bench", "quality", "--engine-option", "kv_codec=int3"],
        ["bench", "serve", "--lengths", "500,1000"],
        ["bench", "decode", "--baselines", "transformers"],
        ["bench", "gpu", "--engine-option", "kv_codec=int8"],
        ["demo", "--baselines", "vllm"],
    ],
)
def test_bad_values_are_refused_while_parsing(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
