"""`speclab serve`: start the dashboard's Panel server (loopback unless told otherwise).

    serve(port=5006)                   # blocks; prints the address to open
    add_serve(subparsers)              # adds `serve --port --host --show` to an argparse CLI

Same app as `panel serve speclab/apps/dashboard.py`: every session gets a fresh Dashboard.
"""
from __future__ import annotations

# uploads travel over the websocket as base64 (4/3 of the file): room for the app's own limit,
# so an oversized trace gets the page's message instead of a dropped connection
WEBSOCKET_MAX_MESSAGE = 64 * 1024 * 1024


def serve(port: int = 5006, host: str = "127.0.0.1", show: bool = False, threaded: bool = False):
    """Serve the dashboard at http://host:port/ (blocks unless threaded=True, which returns the
    server so a caller can .stop() it)."""
    import panel as pn

    from speclab.apps.dashboard import app
    url = f"http://{host}:{port}/"
    print(f"speclab dashboard: open {url}  (Ctrl-C to stop)", flush=True)
    return pn.serve({"/": app}, port=port, address=host, show=show, threaded=threaded,
                    websocket_origin=[f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"],
                    websocket_max_message_size=WEBSOCKET_MAX_MESSAGE, title="speclab dashboard")


def cmd_serve(a) -> int:
    serve(port=a.port, host=a.host, show=a.show)
    return 0


def add_serve(subparsers):
    """`speclab serve [--port 5006] [--host 127.0.0.1] [--show]` for speclab/cli.py."""
    p = subparsers.add_parser("serve", help="serve the dashboard in a browser",
                              description="Serve the speclab dashboard (Panel) on this machine.")
    p.add_argument("--port", type=int, default=5006)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--show", action="store_true", help="open a browser tab")
    p.set_defaults(func=cmd_serve)
    return p


if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser(prog="python -m speclab.apps.serve")
    sub = ap.add_subparsers(dest="command")
    add_serve(sub)
    args = ap.parse_args(sys.argv[1:] or ["serve"])
    sys.exit(args.func(args))
