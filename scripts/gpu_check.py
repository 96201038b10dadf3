"""One script for the first CUDA machine: speed and losslessness of speclab on a GPU.

    python scripts/gpu_check.py [--out gpu_check.json]      # a CUDA GPU, a few minutes
    python scripts/gpu_check.py --smoke                     # the same code on a CPU, tiny shapes

For three Llama-shaped models (SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B configs) with random
layers and an LM head that maps token t to t+1 (so greedy decoding has wide margins and every method
can be held to `ar` token for token), it measures in bf16, batch 1, on random prompts:

  ar (its token kept on the device, the host a step behind), ar through the engine's host loop,
  oracle[k=2,4,8] (a perfect draft: the ceiling a draft of length k reaches), prompt-lookup (a
  prompt with nothing to find), a batch of 8 ar, transformers' generate eager and with
  cache_implementation="static" (warmed until compiled), ar with graphs off (the static runner
  eager, and the eager lean forward), the bandwidth limit (weight bytes per token over a measured
  device copy rate), each output's equality with ar, and a torch.profiler summary of ar (device
  kernel time against wall time per round);
  eagle and eagle3 with drafts built for the shape (an EAGLE head that passes the token's embedding
  through to the target's t -> t+1 head, so it drafts well; a random EAGLE-3 draft): their target
  verifies capture hidden states inside the static runner's graphs (CUDA; the static runner eager
  under --smoke), each row saying whether graphs replayed its target.

Then every method of the toy zoo against ar on the same device in fp32 and bf16. It prints a table
and writes JSON (--out, default stdout). Timings on CUDA wait for the device before every clock
read; each timed row runs once untimed first (graph capture, compilation) and reports the median of
--repeats runs.

On the device tool (64 MiB of checkout travel): it needs no SmolLM2 part, so leave the data package
behind for the call, `git rm -r --cached -q speclab-zoo` and `/speclab-zoo/` in .git/info/exclude,
then `git reset -q` and drop that line afterwards (commit nothing in between).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import speclab  # noqa: E402
from speclab.bench.bandwidth import BandwidthProbe, bandwidth_limit  # noqa: E402
from speclab.bench.peers import run_peer  # noqa: E402
from speclab.decoding.speculative import Drafter  # noqa: E402

# (hidden, intermediate, layers, heads, kv heads, vocab, rope theta)
SHAPES = {
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 100000.0),
    "llama-1b": (2048, 8192, 16, 32, 8, 128256, 500000.0),
    "llama-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0),
}
# --smoke: the same three names, each shrunk to a size a CPU test runs in seconds (4 layers: an
# EAGLE-3 draft reads three distinct ones)
SMOKE = {name: (64, 128, 4, 4, 2, 512, theta) for name, (*_, theta) in SHAPES.items()}
ZOO_PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef walk(root):"]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape, device, dtype, seed: int = 0):
    """A Llama of `shape` with random layers whose head maps token t to t+1: the embedding dominates
    the residual stream (the layers' output projections are scaled down), and the head's row t+1 is
    the embedding of t, so the last position's logits peak at its own token + 1 by a wide margin."""
    from transformers import LlamaConfig, LlamaForCausalLM
    C, F, L, H, Hkv, V, theta = shape
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=Hkv, max_position_embeddings=131072,
                      rope_theta=theta, tie_word_embeddings=False, bos_token_id=0, eos_token_id=V - 1)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.normal_(0.0, 1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
        model.lm_head.weight.copy_(torch.roll(emb, 1, 0) * (10.0 / C))
    return model.eval()


def tokenizer(V: int):
    """A word-level tokenizer of V tokens t0..t{V-1}; the last is the end of text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=f"t{V - 1}", pad_token="t0", unk_token="t0")


def prompts(V: int, n: int, length: int, new: int, seed: int = 1) -> list[list[int]]:
    """Random prompts whose greedy continuations (t+1, t+2, ...) never reach the end-of-text token."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, V - new - 8, (n, length), generator=g).tolist()


def timed(fn, device, repeats: int, warm: bool = True):
    """fn() -> (ids, new tokens, extra dict, its own wall or None); median wall over `repeats` timed
    calls, after one untimed call (graph capture, compilation). A row's own wall is the engine's
    (speclab's decode loop, without the oracle's reference run) or the peer's, each read after the
    device finished; otherwise the call is timed here, between two device syncs."""
    if warm:
        fn()
    walls, out = [], None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        walls.append(out[3] if out[3] is not None else time.perf_counter() - t0)
    wall = statistics.median(walls)
    ids, new, extra, _ = out
    return dict(ids=ids, wall_s=round(wall, 4), tokens_per_s=round(new / wall, 1), **extra)


def speclab_row(target, prompt, method, params, new, backend="auto"):
    def fn():
        r = speclab.generate(target, prompt, method, max_new_tokens=new, record=None, backend=backend, **params)
        t = r.trace.totals
        info = r.trace.models.get("target")
        return r.ids, t.new_tokens, dict(tau=round(t.tau, 3), target_forwards=t.target_forwards,
                                         backend=r.trace.params.get("backend"),
                                         graphs=getattr(info, "graphs", None), **split(r.trace)), t.wall_s
    return fn


def split(trace) -> dict:
    """The prompt's round (the prefill: eager, wider than a bucket) apart from the decode after it:
    a row's tokens per second mixes the two."""
    if not trace.rounds:
        return {}
    first = trace.rounds[0]
    pre = first.draft_s + first.verify_s
    rest = trace.totals.wall_s - pre
    n = trace.totals.new_tokens - len(first.tokens)
    return dict(prefill_s=round(pre, 4), decode_tokens_per_s=round(n / rest, 1) if rest > 0 and n > 0 else None)


class HostLoop(Drafter):
    """`ar` through the engine's host loop (a Drafter subclass that proposes nothing keeps it): the
    row that shows what the device loop, greedy `ar`'s default on the static runner, saves."""
    name = "ar-host-loop"


def feature_drafts(model):
    """An EAGLE head and an EAGLE-3 draft for `model` (the t -> t+1 Llama of build()). The EAGLE head
    fuses (feature, next token) into the token's embedding alone, its layer adds nothing and it scores
    with the target's own head: from token x it drafts x + 1, as the target would. The EAGLE-3 draft
    is random over the first 32,000 ids (its drafts are rarely accepted): it exercises the capture of
    three target layers per verify."""
    from speclab.models import eagle3 as E
    from speclab.models.heads import build_eagle, head_config
    dev, dtype = model.device, model.dtype
    V, C, L = model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers
    ids = torch.arange(V, device=dev)
    head = build_eagle(model, head_config(model.config, "eagle"), ids)
    with torch.no_grad():
        head.eagle_fc.weight.zero_()
        head.eagle_fc.bias.zero_()
        head.eagle_fc.weight[:, C:] = torch.eye(C)
        layer = head.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        head.lm_head.weight.copy_(model.lm_head.weight[ids])
    torch.manual_seed(1)
    d3 = E.new_draft(model.config, min(V, 32000), [2, L // 2 + 1, L])
    with torch.no_grad():
        d3.lm_head.weight.copy_(model.lm_head.weight[d3.draft_ids].cpu())
    return head.eval(), d3.to(dev, dtype).eval().requires_grad_(False)


def feature_row(target, prompt, method, draft, new, backend):
    def fn():
        from speclab.decoding.drafters.eagle3 import Eagle3Drafter
        m = Eagle3Drafter(target[0], draft, verifier=False) if method == "eagle3" else method
        kw = {} if method == "eagle3" else dict(draft=(draft, target[1]))
        r = speclab.generate(target, prompt, m, max_new_tokens=new, record=None, backend=backend, **kw)
        t, info = r.trace.totals, r.trace.models["target"]
        return r.ids, t.new_tokens, dict(tau=round(t.tau, 3), target_forwards=t.target_forwards,
                                         backend=info.backend, graphs=info.graphs), t.wall_s
    return fn


def batch_row(target, batch_prompts, new):
    def fn():
        rs = speclab.generate(target, batch_prompts, "ar", max_new_tokens=new, record=None)
        return rs[0].ids, sum(r.trace.totals.new_tokens for r in rs), dict(
            batch=len(rs), backend=rs[0].trace.params.get("backend")), None
    return fn


def peer_row(name, model, tok, prompt, new):
    def fn():
        r = run_peer(name, model, tok, prompt, new)
        return r["ids"], len(r["ids"]), dict(target_forwards=r["target_forwards"]), r["wall_s"]
    return fn


def profile_ar(target, prompt, new, device, backend: str = "auto") -> dict:
    """torch.profiler over one ar run (on `backend`): device kernel time against wall time, per round."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        r = speclab.generate(target, prompt, "ar", max_new_tokens=new, record=None, backend=backend)
        sync(device)
        wall = time.perf_counter() - t0
    rounds = max(r.trace.totals.target_forwards, 1)
    ka = prof.key_averages()
    dev_t = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0
    kernel_s = sum(dev_t(e) for e in ka) / 1e6 if device.type == "cuda" else None
    top = sorted(ka, key=lambda e: dev_t(e) if device.type == "cuda" else e.self_cpu_time_total, reverse=True)[:8]
    # the host's side: which torch calls the decode loop makes per round, and what they cost on the CPU
    # (a launch, a copy, a sync each): what stands between two graph replays
    host = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return dict(rounds=rounds, wall_ms_per_round=round(1e3 * wall / rounds, 3),
                kernel_ms_per_round=None if kernel_s is None else round(1e3 * kernel_s / rounds, 3),
                kernel_share=None if kernel_s is None else round(kernel_s / wall, 3),
                top=[dict(op=e.key, calls=e.count,
                          ms_per_round=round((dev_t(e) if device.type == "cuda" else e.self_cpu_time_total)
                                             / 1e3 / rounds, 4)) for e in top],
                host=[dict(op=e.key, calls_per_round=round(e.count / rounds, 2),
                           cpu_ms_per_round=round(e.self_cpu_time_total / 1e3 / rounds, 4)) for e in host])


ROW_LABELS = ["ar", "ar[host-loop]", "oracle[k=2]", "oracle[k=4]", "oracle[k=8]", "prompt-lookup", "hf-static", "ar[static-compile]",
              "ar[static-compile-ops]",
              "ar[batch=8]", "ar[graphs=off]", "ar[lean eager]", "hf-greedy", "eagle", "eagle3"]


def row_labels(name: str, device, args) -> list[str]:
    """The rows of shape `name` in the order they run (ar first: every output is held to it; the
    issue's goals next), less those --only leaves out."""
    compiled = device.type == "cuda" and name in args.compile_shape.split(",")
    labels = [l for l in ROW_LABELS if not l.startswith("ar[static-compile") or compiled]
    only = dict(o.split(":", 1) for o in args.only or [])
    return [l for l in labels if l in only[name].split("|")] if name in only else labels


def describe(e: BaseException) -> dict:
    """A row's error: its first line and the innermost frames of speclab's and this script's code."""
    import traceback
    frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_tb(e.__traceback__)
              if "speclab" in f.filename or "gpu_check" in f.filename]
    return dict(error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}", where=frames[-4:])


def fatal(e: BaseException) -> bool:
    """A CUDA error that leaves the process's context unusable (an illegal access, a device assert)."""
    return isinstance(e, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(e)


def check_shape(name, shape, device, args, labels: list[str], out_path: str | None = None) -> dict:
    """Build the shape's model, time `labels` in order (each row's JSON saved as it lands), then the
    bandwidth probe and ar's profile. A fatal CUDA error stops the rows: out["fatal"] names the row."""
    dtype = torch.bfloat16
    t0 = time.perf_counter()
    model = build(shape, device, dtype)
    tok = tokenizer(shape[5])
    target = (model, tok)
    ps = prompts(shape[5], 8, args.prompt_len, args.new)
    p = ps[0]
    out = dict(shape=name, config=dict(zip(("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab",
                                             "rope_theta"), shape)),
               params=sum(x.numel() for x in model.parameters()), dtype=str(dtype).replace("torch.", ""), rows={})
    rows = out["rows"]
    static = "static" if device.type == "cuda" else "static-eager"
    drafts = {}

    def feature(m):
        if not drafts:
            drafts["eagle"], drafts["eagle3"] = feature_drafts(model)
        return feature_row(target, p, m, drafts[m], args.new, static)

    make = {"ar": lambda: speclab_row(target, p, "ar", {}, args.new),
            "ar[host-loop]": lambda: speclab_row(target, p, HostLoop(), {}, args.new),
            "prompt-lookup": lambda: speclab_row(target, p, "prompt-lookup", {}, args.new),
            "hf-static": lambda: peer_row("hf-static", model, tok, p, args.new),
            "ar[static-compile]": lambda: speclab_row(target, p, "ar", {}, args.new, backend="static-compile"),
            "ar[static-compile-ops]": lambda: speclab_row(target, p, "ar", {}, args.new, backend="static-compile-ops"),
            "ar[batch=8]": lambda: batch_row(target, ps, args.new),
            "ar[graphs=off]": lambda: speclab_row(target, p, "ar", {}, args.new, backend="static-eager"),
            "ar[lean eager]": lambda: speclab_row(target, p, "ar", {}, args.new, backend="fast"),
            "hf-greedy": lambda: peer_row("hf-greedy", model, tok, p, args.new),
            "eagle": lambda: feature("eagle"), "eagle3": lambda: feature("eagle3")}
    make.update({f"oracle[k={k}]": (lambda k=k: speclab_row(target, p, "oracle", dict(k=k), args.new)) for k in (2, 4, 8)})
    for label in labels:
        t1 = time.perf_counter()
        try:
            if label == args.fail_row:
                raise RuntimeError("CUDA error: simulated by --fail-row")
            rows[label] = timed(make[label](), device, args.repeats, warm=not args.smoke and not args.diag)
            sync(device)                        # an asynchronous fault is this row's, not the next one's
        except Exception as e:                  # one failing row must not hide the others' numbers
            rows[label] = describe(e)
            if fatal(e):
                out["fatal"] = label
        rows[label]["row_s"] = round(time.perf_counter() - t1, 1)
        print(f"gpu_check: {name} {label}: {rows[label].get('tokens_per_s', rows[label].get('error'))}"
              f" ({rows[label]['row_s']} s)", file=sys.stderr, flush=True)
        save(out, out_path)
        if "fatal" in out:
            return out
    if not args.diag:
        try:
            probe = BandwidthProbe(device, dtype, mib_stream=16 if args.smoke else 1024,
                                   mib_gemv=8 if args.smoke else 256)
            probe.sample(2 if args.smoke else 5)
            out["bandwidth"] = bandwidth_limit(model, probe.summary())
            if "error" not in rows.get("ar", {}):     # ar ran here, or in an earlier worker
                out["profile_ar"] = profile_ar(target, p, args.new, device)
            for label, key in (("ar[static-compile]", "profile_ar_compiled"),     # which kernels inductor's
                               ("ar[static-compile-ops]", "profile_ar_compile_ops")):     # steps run
                if "tokens_per_s" in rows.get(label, {}):
                    out[key] = profile_ar(target, p, args.new, device, label[3:-1])
        except Exception as e:
            out["after_rows"] = describe(e)
    out["build_and_run_s"] = round(time.perf_counter() - t0, 1)
    save(out, out_path)
    return out


def finish_shape(out: dict) -> dict:
    """Each row held to ar (ids, speed), and the issue's goals."""
    rows = out["rows"]
    ar = rows.get("ar", {})
    ref = ar.get("ids")
    for label, r in rows.items():
        if "ids" in r:
            r["identical_to_ar"] = None if ref is None else r["ids"] == ref
            r["speedup_vs_ar"] = round(r["tokens_per_s"] / ar["tokens_per_s"], 3) if "tokens_per_s" in ar else None
            r["new_tokens"] = len(r.pop("ids"))
    if "bandwidth" in out:
        out["goals"] = goals(rows, out["bandwidth"])
    return out


def run_worker(kind: str, name: str, args, labels: list[str] | None, deadline: float, diag: bool = False) -> dict:
    """One shape's rows (or one zoo target) in a process of its own: a fatal CUDA error (the
    context is lost with it) ends that process only. Returns its JSON, partial if it was cut short."""
    import os
    import subprocess
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, __file__, "--worker", f"{kind}:{name}", "--worker-out", path, "--new", str(args.new),
           "--prompt-len", str(args.prompt_len), "--repeats", str(1 if diag else args.repeats),
           "--compile-shape", args.compile_shape]
    if labels is not None:
        cmd += ["--only", f"{name}:{'|'.join(labels)}"]
    if args.smoke:
        cmd.append("--smoke")
    if args.fail_row and not diag:
        cmd += ["--fail-row", args.fail_row]
    if diag:
        cmd.append("--diag")
    env = dict(os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if diag else {}))
    left = deadline - time.perf_counter()
    tail = ""
    try:
        r = subprocess.run(cmd, env=env, timeout=max(left, 1), stderr=subprocess.PIPE, text=True)
        tail, code = r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        tail, code = (e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""), "timeout"
    sys.stderr.write("".join(l + "\n" for l in tail.splitlines() if l.startswith("gpu_check")))
    try:
        got = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        got = {}
    Path(path).unlink(missing_ok=True)
    if code != 0:
        got["exit"] = code
        got["stderr_tail"] = [l for l in tail.splitlines() if l.strip() and "USDT" not in l][-25:]
    return got


def check_shape_isolated(name: str, device, args, deadline: float) -> dict:
    """check_shape in worker processes: after a fatal row, a CUDA_LAUNCH_BLOCKING run of that row
    alone (where its traceback points), then a fresh process for the rows after it."""
    labels = row_labels(name, device, args)
    merged = None
    while labels:
        if time.perf_counter() > deadline:
            merged = merged or dict(shape=name, rows={})
            merged["rows"].update({l: dict(error="not run: --deadline-s reached") for l in labels})
            break
        got = run_worker("shape", name, args, labels, deadline)
        rows = got.get("rows", {})
        if merged is None:
            merged = dict(dict(shape=name), **{k: v for k, v in got.items() if k != "rows"}, rows={})
        else:
            merged.update({k: v for k, v in got.items() if k not in ("rows", "fatal")})
        merged["rows"].update(rows)
        bad = got.get("fatal") or (next((l for l in labels if l not in rows), None) if got.get("exit") else None)
        if bad is None:
            break
        merged.setdefault("fatal_rows", []).append(bad)
        merged["rows"].setdefault(bad, dict(error=f"worker ended ({got.get('exit')}) in this row"))
        merged["rows"][bad]["stderr_tail"] = got.get("stderr_tail", [])[-12:]
        if deadline - time.perf_counter() > 60:
            d = run_worker("shape", name, args, [bad], deadline, diag=True)
            merged["rows"][bad]["diag_launch_blocking"] = d.get("rows", {}).get(bad) or d.get("stderr_tail")
        labels = labels[labels.index(bad) + 1:]
    merged.pop("fatal", None)
    merged.pop("exit", None)
    return merged


def goals(rows: dict, limit: dict) -> dict:
    """The issue's targets for this shape, each True / False (None where a row is missing)."""
    tps = lambda k: rows.get(k, {}).get("tokens_per_s")
    ratio = lambda a, b: None if tps(a) is None or tps(b) is None else round(tps(a) / tps(b), 3)
    ar_limit = None if tps("ar") is None else round(tps("ar") / limit["limit_tokens_per_s"], 3)
    return dict(ar_vs_hf_static=ratio("ar", "hf-static"), ar_share_of_bandwidth_limit=ar_limit,
                oracle4_vs_ar=ratio("oracle[k=4]", "ar"), prompt_lookup_vs_ar=ratio("prompt-lookup", "ar"),
                graphs_on_vs_off=ratio("ar", "ar[graphs=off]"),
                device_loop_vs_host_loop=ratio("ar", "ar[host-loop]"),
                compile_ops_vs_ar=ratio("ar[static-compile-ops]", "ar"),
                compile_ops_vs_hf_static=ratio("ar[static-compile-ops]", "hf-static"))


def check_zoo(name: str, device, dtype, new: int, smoke: bool) -> dict:
    """Every lossless speculative method on zoo target `name` against ar on `device` in `dtype`,
    token for token; drafts and heads are the zoo's pairing for the target (code-draft for the toy)."""
    from speclab.decoding.registry import methods
    from speclab.models.zoo import load
    target = load(name, device=device, dtype=dtype)
    draft = load("code-draft", device=device, dtype=dtype) if name == "code-target" else None
    names = [m["name"] for m in methods() if m["family"] not in ("diffusion", "dag") and m["lossless"]]
    prompts_ = ZOO_PROMPTS[:1] if smoke else ZOO_PROMPTS[:2]
    ref = [speclab.generate(target, p, "ar", max_new_tokens=new, record=None).ids for p in prompts_]
    res = {}
    for m_name in names:
        try:
            need = next(m["needs_draft"] for m in methods() if m["name"] == m_name)
            kw = dict(draft=draft) if need and draft is not None and m_name in ("draft-model", "tree-static",
                                                                                 "tree-dynamic") else {}
            ids = [speclab.generate(target, p, m_name, max_new_tokens=new, record=None, **kw).ids for p in prompts_]
            res[m_name] = dict(identical=ids == ref)
        except Exception as e:                  # e.g. a feature head the zoo does not ship for it
            res[m_name] = dict(skipped=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    ran = [r for r in res.values() if "identical" in r]
    return dict(target=name, methods=res, identical=sum(r["identical"] for r in ran), ran=len(ran),
                prompts=len(prompts_), new_tokens=new)


def table(report: dict) -> str:
    lines = [f"# speclab gpu_check on {report['device']} (torch {report['torch']}, transformers "
             f"{report['transformers']}), bf16, batch 1, prompt {report['prompt_len']}, {report['new_tokens']} new tokens"]
    for s in report["shapes"]:
        b = s.get("bandwidth")
        limit = (f"bandwidth limit {b['limit_tokens_per_s']} tok/s ({b['weight_mb_per_token']} MB/token at "
                 f"{b['bandwidth_gb_s']} GB/s)") if b else "bandwidth not measured"
        params = f"{s['params'] / 1e6:.0f}M params" if "params" in s else "not built"
        lines += ["", f"## {s['shape']} ({params}): {limit}",
                  "| row | tok/s | decode tok/s | prefill ms | x ar | tau | = ar | backend |",
                  "|---|---|---|---|---|---|---|---|"]
        for label, r in s["rows"].items():
            if "error" in r:
                lines.append(f"| {label} | error: {r['error'][:80]} {' < '.join(r.get('where', [])[-2:])} | | | | | | |")
                continue
            same = {True: "yes", False: "NO", None: "?"}[r.get("identical_to_ar")]
            pre = "" if r.get("prefill_s") is None else round(1e3 * r["prefill_s"], 1)
            lines.append(f"| {label} | {r['tokens_per_s']} | {r.get('decode_tokens_per_s', '')} | {pre} | "
                         f"{r.get('speedup_vs_ar')} | {r.get('tau', '')} | "
                         f"{same} | {r.get('backend', '')}{', CUDA graphs' if r.get('graphs') else ''} |")
        for key, what in (("profile_ar", "ar"), ("profile_ar_compiled", "ar[static-compile]"),
                          ("profile_ar_compile_ops", "ar[static-compile-ops]")):
            pr = s.get(key)
            if pr:
                lines.append(f"{what} profile: {pr['wall_ms_per_round']} ms wall / round, kernels "
                             f"{pr['kernel_ms_per_round']} ms ({pr['kernel_share']} of wall); top: "
                             + "; ".join(f"{t['op'][:48]} x{t['calls']} {t['ms_per_round']} ms" for t in pr["top"][:5]))
        lines.append(f"goals: {s.get('goals')}; fatal rows: {s.get('fatal_rows', [])}")
    for dt, z in report.get("zoo", {}).items():
        if "error" in z:
            lines.append(f"zoo {dt}: {z['error']}")
            continue
        bad = [n for n, r in z["methods"].items() if r.get("identical") is False]
        lines.append(f"zoo {dt}: {z['identical']}/{z['ran']} methods identical to ar"
                     + (f"; DIFFER: {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, few tokens, one run each: the code path on a CPU")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, from " + ", ".join(SHAPES))
    ap.add_argument("--only", action="append", metavar="SHAPE:ROW|ROW",
                    help="run only these rows of SHAPE (repeatable), e.g. 'smollm2-135m:ar|eagle'; rows: "
                         + ", ".join(ROW_LABELS))
    ap.add_argument("--new", type=int, default=None, help="new tokens per run (128; --smoke 8)")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (200; --smoke 24)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row, median reported (3; --smoke 1)")
    ap.add_argument("--compile-shape", default="smollm2-135m",
                    help="the shapes (comma-separated) that also time the static runner under torch.compile "
                         "(CUDA only; about 40 s of compilation each)")
    ap.add_argument("--zoo", default=None,
                    help="zoo targets whose methods are held to ar (default: code-target, and smollm2-135m with its "
                         "heads on CUDA; --smoke: code-target); 'none' skips")
    ap.add_argument("--isolate", choices=("auto", "on", "off"), default="auto",
                    help="each shape (and zoo target) in a process of its own, resumed after a fatal CUDA error "
                         "with a CUDA_LAUNCH_BLOCKING run of the failing row (auto: on CUDA)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no new work after this many seconds; workers are stopped at it (their rows so far kept)")
    ap.add_argument("--fail-row", default=None, help=argparse.SUPPRESS)    # exercises the resume path on a CPU
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)      # shape:NAME or zoo:NAME, internal
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--diag", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.new = args.new or (8 if args.smoke else 128)
    args.prompt_len = args.prompt_len or (24 if args.smoke else 200)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        ap.error("no CUDA device here: run on a GPU machine, or pass --smoke to run the code path on this CPU")
    device = torch.device("cuda" if cuda and not args.smoke else "cpu")
    shapes = SMOKE if args.smoke else SHAPES
    unknown = [s for s in args.shapes.split(",") if s not in shapes]
    unknown += [o for o in args.only or [] if o.split(":")[0] not in shapes or ":" not in o]
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}: use {', '.join(shapes)} (--only SHAPE:ROW|ROW)")
    if args.worker:
        kind, name = args.worker.split(":", 1)
        if kind == "shape":
            check_shape(name, shapes[name], device, args, row_labels(name, device, args), args.worker_out)
        else:
            save(zoo_entry(name, device, args), args.worker_out)
        return None
    import transformers
    report = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  torch=torch.__version__, transformers=transformers.__version__, smoke=args.smoke,
                  new_tokens=args.new, prompt_len=args.prompt_len, repeats=args.repeats, shapes=[])
    if device.type == "cuda":
        report.update(cuda=torch.version.cuda, driver=driver_version())
    isolate = args.isolate == "on" or args.isolate == "auto" and device.type == "cuda"
    report["isolated"] = isolate
    t0 = time.perf_counter()
    deadline = t0 + (args.deadline_s or 7 * 86400)
    for name in args.shapes.split(","):
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        if isolate:
            shape = check_shape_isolated(name, device, args, deadline)
        else:
            shape = check_shape(name, shapes[name], device, args, row_labels(name, device, args))
        report["shapes"].append(finish_shape(shape))
        save(report, args.out)              # a run cut short by its time limit keeps what it measured
        print(table(dict(report, shapes=report["shapes"][-1:], zoo={})), file=sys.stderr, flush=True)
    zoo = args.zoo or ("code-target" if args.smoke or device.type != "cuda" else "code-target,smollm2-135m")
    report["zoo"] = {}
    for target in [] if zoo == "none" else zoo.split(","):
        if time.perf_counter() > deadline:
            report["zoo"][target] = dict(error="not run: --deadline-s reached")
            continue
        print(f"gpu_check: zoo methods, {target} ...", file=sys.stderr, flush=True)
        got = run_worker("zoo", target, args, None, deadline) if isolate else zoo_entry(target, device, args)
        why = ("cut at --deadline-s" if got.get("exit") == "timeout"
               else f"worker ended ({got.get('exit')}): {got.get('stderr_tail', [])[-3:]}")
        report["zoo"].update(got.get("zoo", {}) or {target: dict(error=why)})
        save(report, args.out)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    print(table(report), file=sys.stderr if not args.out else sys.stdout, flush=True)
    if args.out:
        save(report, args.out)
    else:
        print(json.dumps(report, indent=1))
    return report


def zoo_entry(target: str, device, args) -> dict:
    """check_zoo for one zoo target in fp32 and bf16: {"zoo": {"TARGET DTYPE": result}}."""
    got = {}
    for dtype in (torch.float32, torch.bfloat16):
        key = f"{target} {str(dtype).replace('torch.', '')}"
        try:
            got[key] = check_zoo(target, device, dtype, 8 if args.smoke else 32, args.smoke)
        except Exception as e:          # a target not installed here
            got[key] = describe(e)
    return dict(zoo=got)


def save(report: dict, out: str | None):
    """The report as JSON at `out`, atomically (nothing when out is None)."""
    if not out:
        return
    tmp = Path(out).with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)


def driver_version() -> str | None:
    import subprocess
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None



if __name__ == "__main__":
    main()
