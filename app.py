"""otviz app entry point (also the Hugging Face Space's ``app_file``): ``otviz app``."""

import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

if __name__ == "__main__":  # imports under the guard: worker processes re-import this file
    from otviz.cli.app import main

    sys.exit(main(sys.argv[1:], prog="app.py"))
