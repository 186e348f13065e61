"""Smoke test of an installed otviz, run by ``make package-check`` with the Python of a fresh
virtual environment that holds only the wheel and its dependencies, from a folder outside the
checkout: the built wheel and sdist (size, assets as plain files), ``otviz explain`` on a
shipped example image, then ``otviz app`` serving one Align call over HTTP on 127.0.0.1 that
returns heatmaps.

Usage: python package_smoke.py --dist DIR [--port 7871] [--timeout 240]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

MAX_WHEEL_MB = 20


def check(condition: bool, message: str) -> None:
    if not condition:
        sys.exit(f"package smoke test FAILED: {message}")
    print(f"ok: {message}", flush=True)


def check_dist(dist: Path) -> None:
    """One wheel under ``MAX_WHEEL_MB`` whose shipped assets are plain files and whose long
description is the README without its Space front matter, one sdist that holds the whole
test suite (conftest files, helpers, every folder)."""
    wheels, sdists = sorted(dist.glob("otviz-*.whl")), sorted(dist.glob("otviz-*.tar.gz"))
    check(len(wheels) == 1 and len(sdists) == 1, f"one wheel and one sdist in {dist}")
    size_mb = wheels[0].stat().st_size / 2**20
    check(size_mb < MAX_WHEEL_MB, f"the wheel is {size_mb:.1f} MB (< {MAX_WHEEL_MB} MB)")
    with zipfile.ZipFile(wheels[0]) as wheel:
        assets = [i for i in wheel.infolist() if i.filename.startswith("otviz/assets/")]
    links = [i.filename for i in assets if stat.S_ISLNK(i.external_attr >> 16)]
    check(not links, f"the wheel's {len(assets)} asset files are plain files, no links")
    for needed in ("checkpoints/tiny-clip/model.safetensors", "checkpoints/manifest.json",
                   "checkpoints/heads/conceptot/model.safetensors", "examples/captions.json"):
        check(any(i.filename == f"otviz/assets/{needed}" for i in assets),
              f"the wheel holds {needed}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        metadata = next(wheel.read(n).decode() for n in wheel.namelist()
                        if n.endswith(".dist-info/METADATA"))
    description = metadata.split("\n\n", 1)[1]
    check(description.startswith("# otviz") and "sdk: gradio" not in description,
          "the wheel's long description is the README without the Space front matter")
    with tarfile.open(sdists[0]) as sdist:
        shipped = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("tests/conftest.py", "tests/helpers.py", "tests/ui/conftest.py",
                   "tests/towers/conftest.py", "tests/ot/cases.py", "docs/index.md",
                   "otviz/assets/examples/quickstart.ipynb", "app.py", "Makefile"):
        check(needed in shipped, f"the sdist holds {needed} (it runs its own tests)")


def otviz_command() -> str:
    found = shutil.which("otviz", path=str(Path(sys.executable).parent))
    check(found is not None, f"the otviz command is installed beside {sys.executable}")
    return found


def check_installed_package() -> tuple[Path, str]:
    """The package imported is the installed one, and its assets are real files in it."""
    import otviz
    from otviz import assets

    package = Path(otviz.__file__).resolve().parent
    check("site-packages" in package.parts, f"otviz is imported from the environment ({package})")
    for name in assets.ASSETS:
        where = assets.path(name)
        check(where.exists() and not where.is_symlink() and package in where.resolve().parents,
              f"asset {name!r} is shipped in the package ({where})")
    example = json.loads((assets.path("examples") / "captions.json").read_text())[0]
    return assets.path("examples") / example["file"], example["caption"]


def smoke_explain(otviz: str) -> None:
    """The documented ``otviz explain --example 0`` (a shipped example, no checkout)."""
    out = Path("explain.png")
    done = subprocess.run([otviz, "explain", "--example", "0", "--out", str(out)], check=True,
                          capture_output=True, text=True)
    check("INFO" not in done.stderr, f"otviz explain logs no INFO lines ({done.stderr!r})")
    from PIL import Image

    with Image.open(out) as figure:
        check(figure.width > 200 and figure.height > 100,
              f"otviz explain --example 0 wrote a {figure.width}x{figure.height} figure")


def wait_for_server(url: str, server: subprocess.Popen, timeout: float) -> None:
    from urllib.request import urlopen

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"package smoke test FAILED: otviz app exited with {server.returncode}")
        try:
            with urlopen(url + "/config", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    sys.exit(f"package smoke test FAILED: otviz app did not answer at {url} in {timeout:.0f} s")


def heatmap_grid(api: dict, result: tuple) -> Path:
    """The file of /align's phrase-heatmap output (an Image labelled "... heatmap ...")."""
    labels = [r.get("label") or "" for r in api["returns"]]
    where = [k for k, r in enumerate(api["returns"])
             if r["component"] == "Image" and "heatmap" in labels[k].lower()]
    check(len(where) == 1, f"/align has one heatmap image output among {labels}")
    value = result[where[0]]
    return Path(value.get("path") if isinstance(value, dict) else value)


def smoke_app(otviz: str, image: Path, caption: str, port: int, timeout: float) -> None:
    from gradio_client import Client, handle_file
    from PIL import Image

    with socket.socket() as probe:
        check(probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is free")
    log = tempfile.TemporaryFile("w+")  # the server's stderr, read back once it has stopped
    server = subprocess.Popen([otviz, "app", "--host", "127.0.0.1", "--port", str(port)],
                              stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_server(url, server, timeout)
        check(True, f"otviz app answers at {url}")
        client = Client(url, verbose=False)
        api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/align"]
        # by name: the image and caption, every other input its default (the phrase and
        # token pickers: the caption's first)
        result = client.predict(image=handle_file(str(image)), caption=caption,
                                api_name="/align")
        with Image.open(heatmap_grid(api, result)) as grid:
            colours = len(grid.convert("RGB").getcolors(maxcolors=2**24))
            check(grid.width >= 200 and colours > 100,
                  f"the heatmap grid is a {grid.width}x{grid.height} picture of {colours} colours")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.seek(0)
        stderr = log.read()
        sys.stderr.write(stderr)
    check("leaked" not in stderr, "stopped by SIGTERM, the app leaves no process or semaphore")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, required=True, help="folder of the built wheel")
    parser.add_argument("--port", type=int, default=7871)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to start the app")
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    check_dist(args.dist)
    otviz = otviz_command()
    image, caption = check_installed_package()
    smoke_explain(otviz)
    smoke_app(otviz, image, caption, args.port, args.timeout)
    print("package smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
