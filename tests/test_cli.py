"""The command line as a whole: every command explains itself, and README or a topic page of
docs/ documents it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main

from mlxmem.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
# README and the topic pages; not docs/cli.md, which is written from the commands themselves.
DOCUMENTED = "\n".join(
    page.read_text(encoding="utf-8")
    for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
    if page.name != "cli.md"
)


def command_paths() -> list[list[str]]:
    """Every command and group, as the words that name it: ["memory", "rm"], ..."""
    found: list[list[str]] = []

    def walk(group, prefix: list[str]) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            found.append(prefix + [name])
            if hasattr(command, "list_commands"):  # a group (Typer vendors its own click)
                walk(command, prefix + [name])

    walk(typer.main.get_command(app), [])
    return found


def subcommand(path: list[str]) -> click.Command:
    command = typer.main.get_command(app)
    for part in path:
        command = command.get_command(click.Context(command), part)
    return command


def leaf_commands() -> list[list[str]]:
    paths = command_paths()
    return [p for p in paths if not any(q[: len(p)] == p and q != p for q in paths)]


def test_every_command_has_help():
    from conftest import cli

    assert {"chat", "memory", "history", "bench", "models"} <= {p[0] for p in command_paths()}
    for path in command_paths():
        output = cli(*path, "--help").output
        assert "Usage:" in output and "<bool>" not in output
        # click's plain help, wrapped for 80 columns (the test runner's width) with every
        # option name whole
        assert max(len(line) for line in output.splitlines()) <= 80, output
        assert "…" not in output
        assert (subcommand(path).help or "").strip(), f"mlxmem {' '.join(path)} has no help"


def test_the_root_help_lines_match_the_commands_own_help():
    from mlxmem.cli.main import SUBCOMMANDS

    for name, (_, _, short) in SUBCOMMANDS.items():
        own = " ".join(subcommand([name]).help.split())
        assert own.startswith(short.removesuffix("...").rstrip(", ").removesuffix(".")), name


def test_readme_or_a_topic_page_documents_every_command():
    missing = [" ".join(p) for p in leaf_commands() if f"mlxmem {' '.join(p)}" not in DOCUMENTED]
    assert missing == [], f"neither README.md nor docs/ shows: {', '.join(missing)}"


def test_progress_off_a_terminal_is_a_plain_line_now_and_then(capsys):
    from mlxmem.cli import bench

    with bench._progress("eval") as progress:  # pytest's stderr is not a terminal
        progress("conv-1 replay 1/90", 0, 110)
        progress("conv-1 replay 2/90", 1, 110)  # within the half minute: quiet
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["eval: conv-1 replay 1/90 (0/110 done, 0.0 min)"]

    update = bench._plain_progress("turns", every=0.0)
    update("turn 5", 5, 0)
    update("turn 6", 6, 0)
    assert capsys.readouterr().err.splitlines() == [
        "turns: turn 5 (5 done, 0.0 min)",
        "turns: turn 6 (6 done, 0.0 min)",
    ]


def test_dash_m_with_a_model_name_is_refused_before_any_model_loads():
    from conftest import cli

    out = cli("chat", "-m", "tiny", code=1).output
    assert "-M tiny" in out and "mlxmem chat 'tiny'" in out
    assert cli("history", "list").output.strip() == "No conversations yet."


def test_models_default_is_kept_private_and_the_environment_wins(mlxmem_home, monkeypatch):
    from conftest import cli

    monkeypatch.delenv("MLXMEM_MODEL", raising=False)
    # Built in, without the hub (HF_HUB_OFFLINE in tests): the trained GGUF from the index.
    assert cli("models", "default").stdout.strip() == "qwen2.5-coder-1.5b"
    set_tiny = cli("models", "default", "tiny").stdout
    assert set_tiny == "Default model: tiny (chat and serve run it without --model).\n"
    assert (mlxmem_home / "config.toml").stat().st_mode & 0o777 == 0o600
    listed = {r["alias"]: r for r in json.loads(cli("models", "list", "--json").stdout)}
    assert listed["tiny"]["default"] and not listed["qwen2.5-coder-1.5b"]["default"]
    assert "unknown model" in cli("models", "default", "nope", code=1).output
    monkeypatch.setenv("MLXMEM_MODEL", "qwen2.5-3b")
    assert cli("models", "default").stdout.strip() == "qwen2.5-3b"
    monkeypatch.delenv("MLXMEM_MODEL")
    unset = cli("models", "default", "--unset").stdout
    assert unset == "Default model: qwen2.5-coder-1.5b (the built-in default).\n"


def test_models_list_fits_80_columns_with_sizes(mlxmem_home):
    from conftest import runner

    model = mlxmem_home / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_bytes(b"x" * 2_500_000)
    out = runner.invoke(app, ["models", "list"], env={"COLUMNS": "80"}).stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "2.5 MB" in out and "qwen2.5-coder-1.5b *" in out  # a long source folds in its column


def test_models_rm_asks_first_and_frees_the_space(mlxmem_home, tmp_path, monkeypatch):
    from conftest import cli
    from huggingface_hub import constants

    model = mlxmem_home / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert "--yes" in cli("models", "rm", "tiny", code=1).output  # no terminal here
    assert model.is_dir()
    assert "Deleted tiny" in cli("models", "rm", "tiny", "--yes").output
    assert not model.exists()
    assert "not on disk" in cli("models", "rm", "tiny").output
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--mlx-community--Llama-3.2-3B-Instruct-4bit" / "blobs"
    repo.mkdir(parents=True)
    (repo / "abc").write_bytes(b"x" * 1000)
    assert "freed 1.0 kB" in cli("models", "rm", "llama-3.2-3b", "-y").output
    assert not repo.exists()


def test_a_failed_pull_does_not_advise_itself():
    from conftest import cli

    out = cli("models", "pull", "llama-3.2-3b", code=1).output  # HF_HUB_OFFLINE=1 in tests
    assert "HF_HUB_OFFLINE" in out and "models pull" not in out


# MLX and mlx-lm take seconds to import; pydantic, which Typer imports to coerce a --help flag
# left at None, a third of one.
HEAVY = ("mlx", "mlx_lm", "transformers", "pydantic")


def test_commands_that_read_the_store_never_import_mlx(mlxmem_home):
    """Each command imports its own modules only: `memory list` starts in a fraction of the
    time that loading MLX and mlx-lm takes (issue 21)."""
    probe = (
        "import sys\n"
        "from mlxmem.cli.main import run\n"
        "sys.argv = ['mlxmem', *sys.argv[1:]]\n"
        "try:\n    run()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n"
    )
    for args in (["memory", "list", "--json"], ["history", "list"], ["--version"], ["--help"]):
        env = {**os.environ, "MLXMEM_HOME": str(mlxmem_home)}
        out = subprocess.run(
            [sys.executable, "-c", probe, *args],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stderr.strip().splitlines()[-1] == "HEAVY", (args, out.stderr)


def test_only_commands_that_run_a_model_re_execute_with_openblas():
    from mlxmem.cli.main import runs_a_model

    assert runs_a_model(["chat", "hello"]) and runs_a_model(["bench", "speed"])
    assert runs_a_model(["serve", "--port", "0"]) and runs_a_model(["eval", "locomo"])
    for args in (["memory", "list"], ["--version"], ["chat", "--help"], ["bench", "history"], []):
        assert not runs_a_model(args), args


def test_a_port_in_use_suggests_port_0(tmp_path):
    import socket

    from conftest import cli

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # never loaded: the port fails first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        out = cli("serve", "--model", str(model), "--port", port, code=1).output
    assert "--port 0" in out and "Traceback" not in out


def test_sync_status_shows_whole_times(tmp_path):
    import re

    from conftest import runner

    folder = tmp_path / "shared"
    folder.mkdir()
    assert runner.invoke(app, ["sync", str(folder)]).exit_code == 0
    out = runner.invoke(app, ["sync", "--status"], env={"COLUMNS": "80"}).stdout
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d ", out) and "…" not in out, out


def locomo10_sample() -> dict:
    """One item shaped like LoCoMo's published locomo10.json (made up, not its data)."""
    turn = {"speaker": "Ana", "dia_id": "D2:1", "text": "I adopted a cat called Miso."}
    photo = {
        "speaker": "Rui",
        "dia_id": "D1:2",
        "text": "See this!",
        "blip_caption": "a photo of a red kite",
    }
    return {
        "sample_id": "conv-7",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Rui",
            "session_2_date_time": "2:00 pm on 3 May, 2023",
            "session_2": [turn, {"speaker": "Rui", "dia_id": "D2:2", "text": "Lovely name!"}],
            "session_1_date_time": "1:00 pm on 1 May, 2023",
            "session_1": [{"speaker": "Ana", "dia_id": "D1:1", "text": "Hi Rui!"}, photo],
        },
        "qa": [
            {
                "question": "What is Ana's cat called?",
                "answer": "Miso",
                "evidence": ["D2:1"],
                "category": 4,
            }
        ],  # fmt: skip
    }


def test_eval_convert_locomo_writes_the_evals_layout(tmp_path):
    from conftest import cli

    from mlxmem.eval import locomo as ev

    source = tmp_path / "locomo10.json"
    source.write_text(json.dumps([locomo10_sample()]))
    assert (
        "Wrote 1 conversations (conv-7)"
        in cli("eval", "convert-locomo", str(source), str(tmp_path / "out")).output
    )
    conv = ev.load_conversation(tmp_path / "out", "conv-7")
    assert (conv.user_name, conv.assistant_name) == ("Ana", "Rui")
    assert [t["id"] for t in conv.turns] == ["D1:1", "D1:2", "D2:1", "D2:2"]  # by session
    assert conv.turns[1] == {
        "role": "assistant",
        "text": "See this! [shares a photo: a photo of a red kite]",
        "session": 1,
        "session_time": "1:00 pm on 1 May, 2023",
        "id": "D1:2",
    }
    assert conv.questions[0].answer == "Miso"
    (tmp_path / "bad.json").write_text('{"not": "locomo"}')
    assert (
        "not LoCoMo"
        in cli(
            "eval", "convert-locomo", str(tmp_path / "bad.json"), str(tmp_path / "x"), code=1
        ).output
    )


@pytest.mark.e2e
def test_eval_locomo_takes_the_published_file(tmp_path):
    from conftest import cli

    source = tmp_path / "locomo10.json"
    source.write_text(json.dumps([locomo10_sample()]))
    args = [
        "eval",
        "locomo",
        "--data",
        str(source),
        "-M",
        "tiny",
        "--context-tokens",
        "1024",
        "--json",
    ]
    report = json.loads(cli(*args, "--db", str(tmp_path / "bench.duckdb")).stdout)
    assert list(report["per_conversation"]) == ["conv-7"]


def test_endless_stdin_is_refused_after_the_limit_not_read_whole(mlxmem_home):
    # `yes` never ends: reading it whole would never return (nor would 300 MB fit well).
    env = {**os.environ, "MLXMEM_HOME": str(mlxmem_home)}
    feed = subprocess.Popen(["yes", "a line of text"], stdout=subprocess.PIPE)
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from mlxmem.cli.main import run; run()", "chat",
             "--max-message-chars", "1000"],
            stdin=feed.stdout, capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        feed.kill()
        feed.wait()
    assert done.returncode == 1
    assert "more than 1,000 characters" in done.stderr and "nothing was logged" in done.stderr


def test_eval_without_locomo_data_says_how_to_get_it(tmp_path):
    from conftest import cli

    said = cli("eval", "locomo", "--data", str(tmp_path), code=1).output
    assert "convert-locomo" in said and "--data DIR" in said and "locomo10.json" in said


@pytest.mark.parametrize("name", ["bad ", " bad", "two\nlines", "esc\x1bape"])
def test_a_bad_conversation_name_is_refused_before_any_model_loads(tmp_path, name):
    from conftest import cli

    from mlxmem.memory.store import Store

    broken = tmp_path / "model"  # a model that would fail to load: it is never read
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    for args in (["chat", "-M", str(broken), "-c", name, "hi"],
                 ["serve", "-M", str(broken), "--conversation", name]):  # fmt: skip
        out = cli(*args, code=1).output
        assert "conversation name" in out and "config.json" not in out, out
    assert cli("history", "list").output.strip() == "No conversations yet."
    # A name made before (or arriving from another device) still opens.
    with Store().connect() as con:
        con.execute("INSERT INTO conversations (name, created_at) VALUES (?, now())", [name])
    assert Store().check_name(name) == name
