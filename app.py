"""otviz app entry point (also the Hugging Face Space's ``app_file``)."""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from otviz.ui.app import launch  # noqa: E402

if __name__ == "__main__":
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
