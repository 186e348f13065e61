"""``otviz`` as a person meets it, run as a separate process: ``otviz --help`` loads no heavy
package, every wrong call is one line on stderr with exit status 2 (no traceback) and is
refused before anything is written, third-party INFO lines stay out of the log, and the
documented ``otviz explain --example 0`` runs from the package's own data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otviz.cli import COMMANDS
from otviz.knobs import METHOD_NAMES
from otviz.ui.examples import load_examples
from tests.helpers import child_env

HEAVY = ("torch", "open_clip", "gradio")


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=600)


def otviz_call(argv: list[str]) -> str:
    return f"import sys; from otviz.cli import main; sys.exit(main({argv!r}))"


def run_otviz(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``otviz argv`` in a fresh interpreter."""
    return run_python(otviz_call(argv), cwd)


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)],
                         ids=lambda c: c[0] if c else "otviz")
def test_help_imports_no_heavy_package(command: list[str], tmp_path: Path) -> None:
    heavy = (*HEAVY, "otviz.eval") if not command else HEAVY  # a command may read its config
    done = run_python(
        "import sys\nfrom otviz.cli import main\n"
        f"try:\n    main({[*command, '--help']!r})\nexcept SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        f"print('loaded:', sorted(m for m in {heavy!r} if m in sys.modules))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "loaded: []"
    assert "usage: otviz" in done.stdout


def test_help_gives_the_whole_description_as_plain_text(tmp_path: Path) -> None:
    done = run_otviz(["--help"], tmp_path)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert ("The otviz command line: serve the app, render the synthetic world, pre-train the "
            "tiny CLIP, train and evaluate method heads, run the ablation, draw the report's "
            "figures, explain an image's words and benchmark the methods.") in text
    assert "``" not in done.stdout


def _invalid_method() -> str:
    choices = ", ".join(repr(n) for n in (*METHOD_NAMES, "all"))
    return f"argument --method: invalid choice: 'nosuch' (choose from {choices})"


WRONG_CALLS = {
    "no command": ([], "otviz", "the following arguments are required: COMMAND"),
    "unknown command": (["nosuch"], "otviz", "argument COMMAND: invalid choice: 'nosuch' "
                        "(choose from 'app', 'world', 'pretrain', 'train', 'eval', 'ablate', "
                        "'report', 'explain', 'bench')"),
    "unknown method": (["train", "--method", "nosuch"], "otviz train", _invalid_method()),
    "zero batch": (["train", "--batch-size", "0"], "otviz train",
                   "argument --batch-size: must be at least 1, got 0"),
    "not a number": (["pretrain", "--steps", "many"], "otviz pretrain",
                     "argument --steps: expected an integer, got 'many'"),
    "unknown loss": (["pretrain", "--loss", "l2"], "otviz pretrain",
                     "argument --loss: invalid choice: 'l2' (choose from 'infonce', "
                     "'entropic_ot', 'dbot', 'unbalanced_ot', 'fgw_ot', 'ufg_ot')"),
    "zero test images": (["eval", "--n-test", "0"], "otviz eval",
                         "argument --n-test: must be at least 1, got 0"),
    "unknown table": (["eval", "--tables", "probe,nope"], "otviz eval",
                      "argument --tables: unknown 'nope'; choose from retrieval, probe, "
                      "grounding, anchors, cost, zero_shot, long_tailed, selective, trust, "
                      "segmentation"),
    "seeds not numbers": (["ablate", "--seeds", "1,x"], "otviz ablate",
                          "argument --seeds: expected a comma list of integers, got '1,x'"),
    "negative examples": (["report", "--n-examples", "-1"], "otviz report",
                          "argument --n-examples: must be at least 1, got -1"),
    "no evaluation": (["report", "--eval-dir", "nowhere"], "otviz report",
                      "no such folder: nowhere (the --out of otviz eval)"),
    "missing file": (["explain", "missing.png", "a red square"], "otviz explain",
                     "no such file: missing.png"),
    "folder as image": (["explain", ".", "a red square"], "otviz explain", "not a file: ."),
    "no caption": (["explain", str(load_examples()[0].image_path)], "otviz explain",
                   "the following arguments are required: caption"),
    "no image": (["explain"], "otviz explain",
                 "the following arguments are required: image (or --example N)"),
    "no such example": (["explain", "--example", "99"], "otviz explain",
                        "argument --example: invalid choice: 99 (choose from "
                        + ", ".join(str(i) for i in range(len(load_examples()))) + ")"),
    "negative count": (["world", "--n", "-3", "--out", "samples"], "otviz world",
                       "argument --n: must be at least 1, got -3"),
    "zero count": (["world", "--n", "0", "--out", "samples"], "otviz world",
                   "argument --n: must be at least 1, got 0"),
    "negative bench size": (["bench", "--ns", "-1"], "otviz bench",
                            "argument --ns: must be at least 1, got -1"),
    "port zero": (["app", "--port", "0"], "otviz app",
                  "argument --port: must be at least 1, got 0"),
    "unknown app flag": (["app", "--no-such-flag"], "otviz app",
                         "unrecognized arguments: --no-such-flag"),
}


@pytest.mark.parametrize("argv, prog, message", WRONG_CALLS.values(), ids=WRONG_CALLS.keys())
def test_a_wrong_call_is_one_line_and_writes_nothing(argv: list[str], prog: str, message: str,
                                                     tmp_path: Path) -> None:
    done = run_otviz(argv, tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"{prog}: error: {message} (see {prog} --help)\n"
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no folder, no figure, no cache


def test_commands_log_ours_at_info_and_other_libraries_from_warning(tmp_path: Path) -> None:
    done = run_python(
        "import logging\nfrom otviz.cli.logs import command_logging\ncommand_logging()\n"
        "logging.info('No potential checkpoint path found')\n"  # open_clip logs on the root
        "logging.getLogger('gradio').info('chatter')\n"
        "logging.getLogger('otviz.train.loop').info('step 10')\n"
        "logging.getLogger('gradio').warning('careful')\n", tmp_path)
    assert done.returncode == 0
    assert done.stderr == "step 10\nWARNING gradio: careful\n"


@pytest.mark.slow
def test_explain_runs_on_a_shipped_example(tmp_path: Path, preloaded_python) -> None:
    done = preloaded_python.run(otviz_call(["explain", "--example", "0", "--out", "fig.png"]),
                                tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote fig.png\n"
    assert (tmp_path / "fig.png").stat().st_size > 0


@pytest.mark.slow
def test_train_logs_its_own_lines_but_not_open_clips(tmp_path: Path, preloaded_python) -> None:
    done = preloaded_python.run(otviz_call(
        ["train", "--method", "filip", "--n-train", "8", "--batch-size", "4", "--max-steps",
         "1", "--concept-dim", "16", "--threads", "1", "--quiet", "--out", "run",
         "--cache-dir", "cache"]), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "filip: local loss local_contrastive" in done.stderr  # otviz's INFO line
    assert "No potential checkpoint" not in done.stderr  # open_clip's, on the root logger
    assert "Instantiating model architecture" not in done.stderr
