"""`speclab serve`: start the dashboard's Panel server (loopback unless told otherwise).

    serve(port=5006)                   # blocks; prints the address to open
    add_serve(subparsers)              # adds `serve --port --host --show --workers --threads-per-run --batch`
    proc = start_process(free_port(), log, **env); ...; stop_process(proc)   # a server to drive (tests, scripts)

Same app as `panel serve speclab/apps/dashboard.py`: every session gets a fresh Dashboard, and
every session's runs go to the server's one RunService (service.py): its workers, queue and limits.
"""
from __future__ import annotations

# uploads travel over the websocket as base64 (4/3 of the file): room for the app's own limit,
# so an oversized trace gets the page's message instead of a dropped connection
WEBSOCKET_MAX_MESSAGE = 64 * 1024 * 1024


SESSION_TOKEN_S = 1800


def serve(port: int = 5006, host: str = "127.0.0.1", show: bool = False, threaded: bool = False,
          service=None, on_session=None, warm: bool = True, **server_kw):
    """Serve the dashboard at http://host:port/ (blocks unless threaded=True, which returns the
    server so a caller can .stop() it). service: the RunService every session's runs go to (default:
    one sized to the machine, SPECLAB_RUN_WORKERS / SPECLAB_RUN_THREADS / SPECLAB_RUN_BATCH where
    set); on_session:
    called with each session's Dashboard; warm: load the page's models before the first Run (warm_up);
    server_kw: passed to Panel's server."""
    import panel as pn

    from speclab.apps.dashboard import app
    from speclab.apps.service import RunService, settings_from_env
    service = service or RunService(settings_from_env())
    url = f"http://{host}:{port}/"
    print(f"speclab dashboard: open {url}  ({service.settings.workers} worker(s), "
          f"{service.settings.threads_per_run} thread(s) a run, batches of up to {service.settings.batch}; "
          "Ctrl-C to stop)", flush=True)

    if warm:
        warm_up(service)

    def page():                  # a plain function: Panel calls functions per session (not partials)
        return app(service, on_session)
    # a class opening its pages at once: the server builds them one by one (seconds each on 2 busy
    # cores), and Bokeh's 5-minute session token expired before the last were built (load test, 30)
    server_kw.setdefault("session_token_expiration", SESSION_TOKEN_S)
    return pn.serve({"/": page}, port=port, address=host, show=show,
                    threaded=threaded, websocket_origin=[f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"],
                    websocket_max_message_size=WEBSOCKET_MAX_MESSAGE, title="speclab dashboard", **server_kw)


def warm_up(service, models: tuple[str, ...] | None = None):
    """Load the page's models (the pair it opens on) and run them once, as the service's first
    request, so a class's first Run waits for no model load (15-30 s for the real pair on a busy
    2-core CPU). Its time is not one a page's wait is estimated from. -> its Ticket."""
    from speclab.apps import runs
    from speclab.apps.form import CHAT_MODELS, default_pair
    models = models or default_pair(runs.zoo_models())

    def load():
        for name in models:
            runs.run_one(name, "Hello", "ar", max_new_tokens=2, record=None, chat=name in CHAT_MODELS)
    return service.submit(load, models, kind=("warm-up", *models), timed=False)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_process(port: int, log, **env):
    """`speclab serve --port port` as a subprocess (offline; os.environ plus `env`), its output to
    the open file `log`, once its page answers: the Popen. RuntimeError (the server stopped) where it
    exits or does not answer within two minutes."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **env)
    proc = subprocess.Popen([sys.executable, "-m", "speclab.apps.serve", "serve", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(240):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return proc
        except OSError:
            time.sleep(0.5)
    stop_process(proc)
    raise RuntimeError(f"the server did not answer at {url}")


def stop_process(proc) -> None:
    """Stop a server start_process started, by its own pid: terminate, then kill if it does not
    exit within 15 s."""
    import subprocess
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def cmd_serve(a) -> int:
    from speclab.apps.service import RunService, Settings, settings_from_env
    env = settings_from_env()
    service = RunService(Settings(threads_per_run=a.threads_per_run or env.threads_per_run,
                                  workers=a.workers or env.workers, batch=a.batch or env.batch))
    serve(port=a.port, host=a.host, show=a.show, service=service, warm=not a.no_warm)
    return 0


def _at_least_one(v: str) -> int:
    import argparse
    if not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError(f"{v!r}: give a whole number of at least 1")
    return int(v)


def add_serve(subparsers):
    """`speclab serve [--port 5006] [--host 127.0.0.1] [--show]` for speclab/cli.py."""
    p = subparsers.add_parser("serve", help="serve the dashboard in a browser",
                              description="Serve the speclab dashboard (Panel) on this machine.")
    p.add_argument("--port", type=int, default=5006)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--show", action="store_true", help="open a browser tab")
    p.add_argument("--workers", type=_at_least_one, default=None,
                   help="runs at once (default: cores // threads per run)")
    p.add_argument("--threads-per-run", type=_at_least_one, default=None,
                   help="torch threads each run uses (default: half the cores, at most 4)")
    p.add_argument("--batch", type=_at_least_one, default=None,
                   help="queued runs of one method, model and settings decoded as one batch (default 8; 1: "
                        "each alone)")
    p.add_argument("--no-warm", action="store_true",
                   help="do not load the page's models at start (the first Run then loads them)")
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
