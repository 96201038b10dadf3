"""`speclab run | methods | train | bench | serve | export`: the command line.

Errors in what the user gave (unknown model, bad parameter, empty prompt, bad trace file) print one
line `speclab: error: ...` and exit with code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from speclab.params import parse_assignment, parse_value as _num   # NAME=VALUE, as the bench and dashboard parse it

EXIT_USAGE = 2
COLORS = {"prompt": "\033[2m", "draft": "\033[32m", "target": "\033[33m", "reset": "\033[0m"}




def add_run(sub):
    p = sub.add_parser("run", help="decode one prompt with one method",
                       description="Decode one prompt with one method and show what happened.")
    p.add_argument("--target", default="code-target", help="zoo name, directory or hub id")
    p.add_argument("--draft", help="draft model for draft-model (zoo name, directory or hub id)")
    p.add_argument("--method", default="ar")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--prompt-file")
    g.add_argument("--chat", metavar="QUESTION",
                   help="a user message, wrapped in the model's chat template (stops at its end-of-turn token)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="auto: bf16 where it decodes at full speed (CUDA; x86 CPUs with AVX2, speclab's kernel), else fp32")
    p.add_argument("--max-new-tokens", type=int,
                   help="new tokens (default 128); dllm-*: the canvas slots (default 64) unless --gen-length")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, help="draft length (draft-model, layer-skip, prompt-lookup, recycling)")
    p.add_argument("--threshold", type=float, help="draft-confidence stop threshold (adaptive length)")
    p.add_argument("--exit-layer", help="layer-skip exit layer, or 'auto'")
    p.add_argument("--gen-length", type=int, help="dllm-*: generation slots (default: --max-new-tokens)")
    p.add_argument("--block-length", type=int, help="dllm-*: semi-autoregressive block (must divide --gen-length)")
    p.add_argument("--steps", type=int, help="dllm-lowconf / prophet / sched: total denoising steps")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="any other method parameter, e.g. --param schedule=heuristic")
    p.add_argument("--rule", help="acceptance rule of the verify: exact (default), typical, lantern, ... "
                                  "(`speclab methods` lists them)")
    p.add_argument("--rule-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter of the rule, e.g. --rule lantern --rule-param delta=0.2")
    p.add_argument("--record", choices=["none", "light", "full"], default="light")
    p.add_argument("--device")
    p.add_argument("--trace", help="save the trace (JSON) here")
    p.add_argument("--check", action="store_true", help="also run greedy ar and report `identical`")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    p.add_argument("--batch-size", type=int, metavar="B",
                   help="decode the prompts of --prompt-file (one {\"prompt\": ...} JSON object or one plain-text "
                        "prompt per line) B at a time, one target forward per round for the batch")
    p.add_argument("--dag-all-outputs", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run)


def rates(s: dict) -> str:
    """'alpha 0.41 (per judged draft token), 17/152 drafted kept' from a run's stats."""
    alpha = "-" if s["alpha"] is None else f"{s['alpha']:.2f}"
    return f"alpha {alpha} (per judged draft token), {s['accepted']}/{s['drafted']} drafted kept"


def method_kwargs(a) -> dict:
    kw = {}
    if a.k is not None:
        kw["k"] = a.k
    if a.threshold is not None:
        kw["threshold"] = a.threshold
    for name in ("gen_length", "block_length", "steps"):
        if getattr(a, name, None) is not None:
            kw[name] = getattr(a, name)
    if a.exit_layer is not None:
        kw["exit_layer"] = a.exit_layer if a.exit_layer == "auto" else _num(a.exit_layer)
    kw.update(assignments(a.param, "--param"))
    return kw


def assignments(items: list[str], flag: str) -> dict:
    """NAME=VALUE flags -> {name: number or text}, parsed as the bench and the dashboard parse them."""
    out = {}
    for item in items:
        try:
            k, v = parse_assignment(item, "k=6" if flag == "--param" else "eps=0.1")
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None
        out[k] = v
    return out


def run_kwargs(a) -> dict:
    """The keywords of speclab.run from `speclab run`'s flags (the same for every engine; a flag the
    user left out is left out here too, so each engine's own default applies)."""
    kw = dict(record=None if a.record == "none" else a.record, seed=a.seed, device=a.device, dtype=a.dtype,
              top_k=a.top_k, top_p=a.top_p, temperature=a.temperature, **method_kwargs(a))
    if a.draft is not None:
        kw["draft"] = a.draft
    if a.chat is not None:
        kw["chat"] = True
    if a.max_new_tokens is not None:
        kw["max_new_tokens"] = a.max_new_tokens
    if getattr(a, "rule", None) is not None:
        kw["rule"] = a.rule
    if getattr(a, "rule_param", None):
        kw["rule_params"] = assignments(a.rule_param, "--rule-param")
    return kw


def cmd_run(a):
    import speclab
    from speclab.decoding.engines import get_engine
    from speclab.decoding.registry import get_method
    if a.batch_size is not None:
        return _run_batch(a)
    if a.prompt_file:
        if not os.path.exists(a.prompt_file):
            raise ValueError(f"prompt file not found: {a.prompt_file}")
        prompt = open(a.prompt_file, encoding="utf-8").read()
    else:
        prompt = a.chat if a.chat is not None else a.prompt
    if a.check and not get_engine(get_method(a.method).engine).verify:
        raise ValueError(f"--check compares with greedy ar: it is for speculative methods, not {a.method}")
    r = speclab.run(a.target, prompt, a.method, **run_kwargs(a))
    # shown by the kind of step its engine records (trace.Steps.field): a graph, a canvas, rounds
    show = {"dag": _show_dag, "denoise": _show_dllm}.get(r.trace.steps_row().field, _show_speculative)
    out = show(a, prompt, r)
    if a.trace:
        r.trace.save(a.trace)
    if a.json:
        print(json.dumps(out))
    return 0


def _show_speculative(a, prompt, r) -> dict:
    import speclab
    import speclab.models.zoo
    chat = a.chat is not None
    out = dict(text=r.text, ids=r.ids, method=a.method, dtype=r.trace.models["target"].dtype, **r.stats,
               guarantee=r.trace.guarantee, **({"rule": r.trace.params["rule"]} if "rule" in r.trace.params else {}))
    if a.check:
        same = {k: v for k, v in method_kwargs(a).items() if k == "backend"}    # ar on the same forward
        ref = speclab.run(a.target, prompt, "ar", max_new_tokens=r.trace.params["max_new_tokens"], record=None,
                          device=a.device, dtype=a.dtype, chat=chat, **same)
        out["identical"] = ref.ids == r.ids
        out["ar_wall_s"] = round(ref.trace.totals.wall_s, 4)
        if not out["identical"]:
            from speclab.decoding.equality import diagnose
            model = speclab.models.zoo.load_shared(a.target, a.device, a.dtype)[0]
            d = diagnose(model, r.trace.prompt_ids, ref.ids, r.ids, same.get("backend", "auto"))
            out["divergence"] = d.to_dict()
            out["why"] = d.explain(r.trace.text_of)
    if a.json:
        return out
    # a chat prompt shows as the user's question, not the whole chat template (system turn and all)
    color = a.color == "always" or (a.color == "auto" and sys.stdout.isatty())
    print(render_colored(r.trace, prompt, color))
    s = r.stats
    print(f"\n[{a.method}] {s['new_tokens']} tokens, {s['target_forwards']} target forwards, "
          f"{s['draft_forwards']} draft forwards, tau {s['tau']:.2f}, {rates(s)}, {s['wall_s']:.2f} s"
          + (f", rule {out['rule']} ({out['guarantee']})" if "rule" in out else "")
          + (f", identical to greedy ar: {out['identical']}" if a.check else ""))
    if a.check:
        up = out["ar_wall_s"] / s["wall_s"] if s["wall_s"] else float("nan")
        print(f"[ar] {len(ref.ids)} tokens in {out['ar_wall_s']:.2f} s: {a.method} {up:.2f}x as fast (one run "
              f"each, first-run costs included; `speclab bench` times methods interleaved and repeated)")
        if out["dtype"] == "bfloat16" and r.trace.models["target"].device == "cpu":
            from speclab.models import kernels
            print(f"[check] {kernels.describe()}")
    if a.check and not out["identical"]:
        print(f"[check] {out['why']}")
    if color:
        print(f"{COLORS['prompt']}prompt{COLORS['reset']}  {COLORS['draft']}accepted draft{COLORS['reset']}  "
              f"{COLORS['target']}from the target{COLORS['reset']}")
    return out


def _show_dag(a, prompt, r) -> dict:
    """A DAG run: its output, and with --dag-all-outputs (or dag-all) every strategy's."""
    t = r.trace.totals
    out = dict(text=r.text, ids=r.ids, method=a.method, new_tokens=t.new_tokens, target_forwards=t.target_forwards,
               wall_s=t.wall_s)
    from speclab.decoding.registry import get_method
    if a.dag_all_outputs or get_method(a.method).strategy == "all":
        from speclab.decoding.dag import decode_text
        from speclab.models.loading import as_model
        model = as_model(a.target, a.device)[0]
        out["outputs"] = {k: decode_text(model, v) for k, v in r.trace.dag.outputs.items()}
    if not a.json:
        print(f"{prompt} -> {r.text}" + "".join(f"\n  {k:<10} {v}" for k, v in out.get("outputs", {}).items()))
    return out


def _show_dllm(a, prompt, r) -> dict:
    t = r.trace.totals
    out = dict(text=r.text, ids=r.ids, method=a.method, new_tokens=t.new_tokens, target_forwards=t.target_forwards,
               tokens_per_forward=round(t.tau, 3), wall_s=t.wall_s)
    if not a.json:
        print(prompt + r.text)
        print(f"\n[{a.method}] {t.new_tokens} tokens in {t.target_forwards} forwards "
              f"({t.tau:.2f} tokens per forward), {t.wall_s:.2f} s")
    return out


def read_prompt_lines(path: str) -> tuple[list[str], bool]:
    """The prompts of a batch file: one {"prompt": ...} (or {"chat": ...}) JSON object or one plain-text
    prompt per line. Returns (prompts, chat)."""
    from speclab.prompts import prompt_text, read_text
    if not os.path.isfile(path):
        raise ValueError(f"prompt file not found: {path}")
    prompts, kinds = [], set()
    for i, line in enumerate(read_text(Path(path)).splitlines()):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            prompts.append(line)
            kinds.add("prompt")
            continue
        try:
            row = json.loads(line)
            kind = "chat" if "chat" in row else "prompt"
            text = row[kind]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i + 1}: a JSON line must be an object with a 'prompt' or 'chat' string ({e})") from e
        prompts.append(prompt_text(text, f"{path}:{i + 1}: {kind!r}"))
        kinds.add(kind)
    if not prompts:
        raise ValueError(f"{path} holds no prompts: write one prompt per line")
    if len(kinds) > 1:
        raise ValueError(f"{path} mixes chat and raw prompts: put each kind in its own file")
    return prompts, kinds == {"chat"}


def _run_batch(a):
    """--batch-size B: the prompts of --prompt-file (or the one --prompt / --chat), B at a time."""
    import speclab
    if not isinstance(a.batch_size, int) or a.batch_size < 1:
        raise ValueError(f"--batch-size must be an integer >= 1, got {a.batch_size}")
    from speclab.decoding.engines import get_engine
    from speclab.decoding.registry import get_method
    if not get_engine(get_method(a.method).engine).batch:
        raise ValueError(f"--batch-size runs speculative methods; {a.method} takes one prompt at a time (drop --batch-size)")
    if a.prompt_file:
        prompts, chat = read_prompt_lines(a.prompt_file)
    else:
        prompts, chat = [a.chat if a.chat is not None else a.prompt], a.chat is not None
    color = a.color == "always" or (a.color == "auto" and sys.stdout.isatty())
    kw = run_kwargs(a) | dict(chat=chat)
    results, wall = [], 0.0
    for start in range(0, len(prompts), a.batch_size):
        rs = speclab.run(a.target, prompts[start:start + a.batch_size], a.method, **kw | dict(seed=a.seed + start))
        wall += rs[0].trace.totals.wall_s
        results += rs
    for i, r in enumerate(results):
        out = dict(index=i, text=r.text, ids=r.ids, method=a.method, batch_size=r.trace.params["batch_size"],
                   lane=r.trace.params["lane"], **r.stats)
        if a.check:
            ref = speclab.run(a.target, prompts[i], "ar", max_new_tokens=r.trace.params["max_new_tokens"], record=None,
                              device=a.device, dtype=a.dtype, chat=chat)
            out["identical"] = ref.ids == r.ids
        if a.trace:
            root, ext = os.path.splitext(a.trace)
            r.trace.save(f"{root}.{i}{ext or '.json'}")
        if a.json:
            print(json.dumps(out))
            continue
        shown = "".join(r.trace.text_of(t) for t in r.trace.prompt_ids) if chat else prompts[i]
        print(f"--- prompt {i} (lane {out['lane']} of {out['batch_size']})")
        print(render_colored(r.trace, shown, color))
        print(f"[{a.method}] {out['new_tokens']} tokens, {out['target_forwards']} batch forwards, "
              f"{out['draft_forwards']} draft forwards, tau {out['tau']:.2f}, {rates(out)}"
              + (f", identical to greedy ar: {out['identical']}" if a.check else ""))
    if not a.json:
        n = sum(len(r.ids) for r in results)
        print(f"\n[{a.method}] {len(results)} prompts in batches of {a.batch_size}: {n} tokens in {wall:.2f} s "
              f"({n / wall if wall else 0:.1f} tokens/s)")
    return 0


def render_colored(trace, prompt: str, color: bool) -> str:
    if not color:
        return prompt + "".join(trace.text_of(t) for r in trace.rounds for t in r.tokens)
    c = COLORS
    parts = [c["prompt"] + prompt + c["reset"]]
    for r in trace.rounds:
        toks = r.tokens
        n_draft = min(len(r.path_tokens), len(toks))
        if n_draft:
            parts.append(c["draft"] + "".join(trace.text_of(t) for t in toks[:n_draft]) + c["reset"])
        if len(toks) > n_draft:
            parts.append(c["target"] + trace.text_of(toks[-1]) + c["reset"])
    return "".join(parts)


def cmd_methods(a):
    from speclab.decoding.registry import methods
    rows = methods()
    if a.json:
        print(json.dumps(rows))
        return 0
    from speclab.decoding.rules import rules
    w = max(len(m["name"]) for m in rows) + 2        # the longest name still leaves a gap
    g = max(len(m["guarantee"]) for m in rows) + 2
    print(f"{'method':<{w}}{'family':<18}{'guarantee':<{g}}{'draft?':<8}summary")
    for m in rows:
        print(f"{m['name']:<{w}}{m['family']:<18}{m['guarantee']:<{g}}"
              f"{'yes' if m['needs_draft'] else '':<8}{m['summary']}")
    table = [(r, ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-") for r in rules()]
    pw = max(len("parameters"), *(len(p) for _, p in table)) + 2     # the widest parameters, then a gap
    print(f"\n{'rule':<{w}}{'guarantee':<{g}}{'needs q':<9}{'greedy':<8}{'parameters':<{pw}}summary")
    for r, params in table:
        only = f" (for {', '.join(r['only_for'])} only)" if r["only_for"] else ""
        print(f"{r['name']:<{w}}{r['guarantee']:<{g}}{'yes' if r['needs_q'] else 'no':<9}"
              f"{'yes' if r['greedy'] else 'no':<8}{params:<{pw}}{r['summary']}{only}")
    return 0


# `speclab train RECIPE ...`: the recipe -> (its module in speclab.train, whether its main reads the
# recipe's name among its arguments). Anything else (the zoo's LMs, -h) goes to speclab.train.zoo.
TRAIN_RECIPES = {
    "digits-dllm": ("dllm", True), "code-dllm": ("dllm", True),
    "numwords": ("dag", True), "dates": ("dag", True),
    "eagle": ("heads", True), "medusa": ("heads", True),
    "eagle3": ("eagle3", False),
    "smollm2-draft": ("smollm2_draft", False),
    "digits-dgemma": ("dgemma", False),
    "smollm2-dllm": ("smollm2_dllm", False),
    "specdecpp": ("specdecpp", False),
    "speckv": ("speckv", False),
    "clover": ("clover", False),
    "falcon": ("falcon", False),
    "peagle": ("peagle", False),
    "flexdraft": ("flexdraft", False),
    "causal-tree": ("causal_tree", False),
    "ppd": ("ppd", False),
    "lud": ("lud", False),
    "hidden-transfer": ("hidden_transfer", False),
    "first": ("first", False),
    "m2r2": ("m2r2", False),
    "learn2pd": ("learn2pd", False),
    "dparallel": ("dparallel", False),
    "judge": ("judge", False),
    "s2d": ("s2d", False),
    "vocab": ("vocab", False),          # a draft's vocabulary size, searched (not a model trained)
}


def cmd_train(a):
    import importlib
    module, named = TRAIN_RECIPES.get(a.rest[0] if a.rest else None, ("zoo", True))
    train_main = importlib.import_module(f"speclab.train.{module}").main
    return train_main(a.rest if named else a.rest[1:]) or 0


def build_parser():
    ap = argparse.ArgumentParser(prog="speclab", description="See and measure fast decoding of language models.")
    sub = ap.add_subparsers(dest="command", required=True)
    add_run(sub)
    m = sub.add_parser("methods", help="list every decoding method")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_methods)
    t = sub.add_parser("train", help="retrain the zoo (see `speclab train -h`)", add_help=False)
    t.add_argument("rest", nargs=argparse.REMAINDER)
    t.set_defaults(func=cmd_train)
    for extra in EXTRA_COMMANDS:
        extra(sub)
    return ap


def add_export(sub):
    p = sub.add_parser("export", help="a saved trace -> one self-contained HTML file", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: __import__("speclab.export", fromlist=["main"]).main(a.rest))


def add_export_drafter(sub):
    p = sub.add_parser("export-drafter", help="an EAGLE-3 drafter (zoo name or directory) -> the speculators "
                       "directory vLLM serves")
    p.add_argument("source", help="zoo name (e.g. smollm2-eagle3) or a speculators / SpecForge directory")
    p.add_argument("out", help="directory to write (replaced atomically)")
    p.add_argument("--verifier", default=None, help="the target it drafts for (hub id or path), if the source names none")
    p.add_argument("--layers", default=None, help="aux layer ids, e.g. 2,15,27, if the source names none")
    p.add_argument("--k", type=int, default=3, help="speculative tokens vLLM drafts by default")

    def run(a):
        from speclab.models.eagle3_export import export_drafter
        from speclab.models.zoo import zoo_path
        src = zoo_path(a.source) or a.source
        print(export_drafter(src, a.out, verifier=a.verifier, k=a.k, layers=a.layers, src=a.source))
    p.set_defaults(func=run)


def add_serve(sub):
    try:
        from speclab.apps.serve import add_serve as _add
    except ImportError:  # the dashboard extra is not installed
        p = sub.add_parser("serve", help="serve the dashboard (needs: pip install speclab[dashboard])")
        p.set_defaults(func=lambda a: (_ for _ in ()).throw(ValueError(
            "the dashboard needs Panel: pip install 'speclab[dashboard]'")))
        return
    _add(sub)


def add_doctor(sub):
    p = sub.add_parser("doctor", help="which CPU kernel path runs here and why: the CPU's flags, the compiler, "
                       "the cached builds")
    p.add_argument("--build", action="store_true", help="build this machine's path now (once, ~20 s) and check "
                   "its products against torch")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(a):
    from speclab.models import kernels, zoo
    check = None
    if a.build:
        kernels.module()
        check = kernels.self_check() if kernels.module() is not None else None
    d = kernels.info()
    d["dtype_auto"] = str(zoo.pick_dtype("auto", zoo.torch.device("cpu"))).removeprefix("torch.")
    if check is not None:
        d["self_check"] = check
    if a.json:
        print(json.dumps(d))
        return 0
    print(f"kernel path: {d['path']} ({d['why']})" + ("" if d["built"] or not a.build else ", not built"))
    print(f"CPU: {d['cpu']} ({d['machine']}); flags: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in d["flags"].items()))
    print(f"paths this CPU runs, best first: {', '.join(d['supported']) or 'none (torch)'}")
    cached = ", ".join(f"{b} {'yes' if c else 'no'}" for b, c in d["cached"].items())
    print(f"builds cached: {cached}")
    print(f"compiler: {d['compiler'] or 'none found (install g++)'}; ninja: {d['ninja'] or 'none found (pip install ninja)'}")
    print(f"dtype='auto' on the CPU: {d['dtype_auto']}" + (f"; environment: {d['env']}" if d["env"] else ""))
    if check is not None:
        print(f"self-check ({d['path']}): {check}")
    if d["advice"]:
        print(f"on this path: {d['advice']}")
    return 0


def _extra_commands():
    from speclab.bench.cli import add_bench
    return [add_bench, add_export, add_export_drafter, add_serve, add_doctor]


EXTRA_COMMANDS = _extra_commands()


def main(argv=None) -> int:
    from speclab.models.zoo import ModelLoadError
    from speclab.trace import TraceError
    ap = build_parser()
    # `train` and `export` hand everything after their name to their own parser; argparse's
    # REMAINDER does not take a leading option (`speclab export -h`), so those go in by hand
    a, extra = ap.parse_known_args(argv)
    if extra and not hasattr(a, "rest"):
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        a.rest = extra + a.rest
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()       # one-line errors stay one line; our own bars remain
    hf_logging.set_verbosity_error()
    try:
        return a.func(a) or 0
    except (ValueError, ModelLoadError, TraceError, FileNotFoundError) as e:
        print(f"speclab: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
