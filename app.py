"""otviz app entry point (also the Hugging Face Space's ``app_file``): ``otviz app``; the
trained heads in a ``heads/`` folder beside this file are offered too (as ``$OTVIZ_HEADS``)."""

import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
HEADS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heads")

if __name__ == "__main__":  # imports under the guard: worker processes re-import this file
    if os.path.isdir(HEADS):  # a Space repository's own trained heads
        listed = [p for p in os.environ.get("OTVIZ_HEADS", "").split(os.pathsep) if p.strip()]
        os.environ["OTVIZ_HEADS"] = os.pathsep.join([*listed, HEADS])
    from otviz.cli.app import main

    sys.exit(main(sys.argv[1:], prog="app.py"))
