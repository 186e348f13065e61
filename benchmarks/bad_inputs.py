"""Counts of the bad-input suite: the hostile catalogue over every event of the served app
(``tests/ui/test_bad_inputs.py``, through gradio_client on loopback) and the browser checks
that errors reach the page (``tests/test_browser.py``, headless Chromium).

Usage: ``python benchmarks/bad_inputs.py``; runs both with pytest, writes
``benchmarks/bad_inputs.json`` (the registry test's own counts, summed over its parts) and
``benchmarks/bad_inputs.md``, and prints the Markdown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).parent
REGISTRY = "tests/ui/test_bad_inputs.py"
BROWSER = ("tests/test_browser.py::test_errors_of_the_align_reads_reach_the_page "
           "tests/test_browser.py::test_every_event_outside_the_queue_never_fails_in_the_page "
           "tests/test_browser.py::test_a_bad_upload_after_an_example_is_a_message "
           "tests/test_browser.py::test_hostile_upload_and_caption_are_plain_messages")


def run(tests: str, junit: Path, env: dict[str, str]) -> dict[str, int]:
    """pytest over ``tests``: passed, failed and skipped counts from its JUnit report."""
    subprocess.run([sys.executable, "-m", "pytest", "-q", *tests.split(), f"--junitxml={junit}"],
                   env=env, check=False)
    suite = ET.parse(junit).getroot().find("testsuite")
    total, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    skipped = int(suite.get("skipped"))
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped}


def markdown(counts: dict, api: dict, browser: dict) -> str:
    c = counts["cases"]
    lines = [
        "# Bad-input suite",
        "",
        "Written by `python benchmarks/bad_inputs.py` (the counts come from the registry test "
        f"`{REGISTRY}` itself).",
        "",
        "| | count |",
        "|---|---|",
        f"| hostile cases | {sum(c.values())} ({c['images']} images, {c['texts']} texts, "
        f"{c['folders']} folders) |",
        f"| events with a person's input (groups driven) | {counts['events']} "
        f"({counts['event_groups']}) |",
        f"| of them served outside the queue | {counts['events_outside_the_queue']} |",
        f"| calls (case x slot x event group) | {counts['calls']} |",
        f"| clean results | {counts['clean_results']} |",
        f"| readable messages | {counts['readable_messages']} |",
        f"| bare errors | {counts['bare_errors']} |",
        f"| unexpected errors | {counts['unexpected_errors']} |",
        f"| raw HTML in a message | {counts['raw_html']} |",
        f"| wrong messages | {counts['wrong_messages']} |",
        f"| leaks (server paths in messages, files read outside) | {counts['leaks']} |",
        f"| unpacked upload folders left / uploads accepted | "
        f"{counts['unpacked_uploads_left']} / {counts['uploads_accepted']} |",
        f"| files added to Gradio's cache (uploads accepted or sent side by side, results "
        f"served; its schedule removes them) | "
        f"{counts['gradio_cache_files_added']} |",
        f"| seconds | {counts['seconds']} |",
        f"| API tests (gradio_client) passed / failed | {api['passed']} / {api['failed']} |",
        f"| browser tests passed / failed / skipped | {browser['passed']} / {browser['failed']} "
        f"/ {browser['skipped']} |",
        "",
        "Event groups (events running one callback on the same inputs) and the slots driven:",
        "",
        "| callback | events | queued | slots |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{g['callback']}` | {g['events']} | {'yes' if g['queued'] else 'no'} | "
              f"{', '.join(g['slots'])} |" for g in counts["groups"]]
    return "\n".join(lines) + "\n"


def merged(parts: list[dict]) -> dict:
    """The counts of the catalogue's parts (one report each) as one: numbers summed, lists
    joined, the case counts (the same in every part) kept."""
    total: dict = {"cases": parts[0]["cases"]}
    for key in parts[0]:
        if key != "cases":
            total[key] = (sum((p[key] for p in parts), []) if isinstance(parts[0][key], list)
                          else round(sum(p[key] for p in parts), 1))
    return total


def main() -> None:
    report = HERE / "bad_inputs.json"
    env = {**os.environ, "OTVIZ_BAD_INPUTS_REPORT": str(report), "PYTHONPATH": os.getcwd()}
    api = run(REGISTRY, HERE / ".bad_inputs_api.xml", env)
    browser = run(BROWSER, HERE / ".bad_inputs_browser.xml", env)
    for junit in HERE.glob(".bad_inputs_*.xml"):
        junit.unlink()
    parts = sorted(HERE.glob("bad_inputs.*.json"))
    counts = merged([json.loads(p.read_text()) for p in parts])
    report.write_text(json.dumps(counts, indent=1))
    for part in parts:
        part.unlink()
    text = markdown(counts, api, browser)
    (HERE / "bad_inputs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
