"""otviz app entry point (also the Hugging Face Space's ``app_file``)."""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

if __name__ == "__main__":  # imports under the guard: worker processes re-import this file
    import argparse

    from otviz.ui.app import launch

    parser = argparse.ArgumentParser(description="Serve the otviz app.")
    parser.add_argument("--max-file-size", default=None,
                        help="largest accepted upload, e.g. 50mb (default: $OTVIZ_MAX_FILE_SIZE "
                        "or 50mb)")
    args = parser.parse_args()
    launch(args.max_file_size, server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
