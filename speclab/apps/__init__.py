"""speclab.apps: the served Panel dashboard (`speclab serve`, or `panel serve speclab/apps/dashboard.py`).

dashboard.py is the page (one Dashboard per browser session), runs.py what it runs (no UI),
serve.py the server entry point and the `serve` subcommand for the CLI.
"""
