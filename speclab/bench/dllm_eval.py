"""Quality against parallelism for the diffusion policies, printed as Markdown tables.

digits-dllm: N held-out ADD prompts (exact match) and N SUM prompts (valid = six digits summing to
s), greedy, every policy on the same prompts; forwards per answer = model forwards per prompt.
code-dllm: prompts from the code-complete set, forwards per generated token and agreement with
the one-token-per-step output (share of positions equal, and share of outputs identical).

smollm2-dllm: the bench's chat questions in the chat template, the same columns plus tokens / s,
and why a threshold commits what it does: the one-per-step runs' confidence at the d-th still-masked
slot of the active block (d = 1 is the frontier, plain next-token prediction through the shift).

  python -m speclab.bench.dllm_eval --n 500 --code-prompts 20 > dllm-eval.md
  python -m speclab.bench.dllm_eval --only-chat --chat-prompts 20 > smollm2-dllm-eval.md
  python -m speclab.bench.dllm_eval --report chat,code-edit --report-prompts 20 --json r.json --plot sweep.png

The report on two cores, a one-thread process per prompt set, then one JSON and one plot:

  python -m speclab.bench.dllm_eval --threads 1 --report chat --report-prompts 20 --json chat.json &
  python -m speclab.bench.dllm_eval --threads 1 --report code-edit --report-prompts 20 --json code.json
  python -m speclab.bench.dllm_eval --merge chat.json,code.json --report-prompts 20 --json r.json --plot sweep.png

A report stopped part way keeps its finished rows in its --json file; the same command with --resume
runs only the policies the file lacks (the one-per-step reference runs again: every row is read
against it).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from tqdm.auto import tqdm

import speclab
from speclab.bench.dllm_curve import _kw, above_curve, sweep_figure
from speclab.bench.plotfile import save_plot
from speclab.train import digits

ONE_PER_STEP = ("dllm-lowconf", {})

DIGIT_POLICIES = [
    ("one per step (lowconf, 8 steps)", "dllm-lowconf", {}),
    ("two per step (lowconf, 4 steps)", "dllm-lowconf", {"steps": 4}),
    ("random remasking, 8 steps", "dllm-lowconf", {"remasking": "random"}),
    ("threshold 0.9", "dllm-threshold", {"threshold": 0.9}),
    ("threshold 0.7", "dllm-threshold", {"threshold": 0.7}),
    ("threshold 0.5", "dllm-threshold", {"threshold": 0.5}),
    ("factor 1.0", "dllm-threshold", {"factor": 1.0}),
    ("Prophet (7.5/5/2.5)", "dllm-prophet", {}),
    ("SchED cosine 7.5->2.5", "dllm-sched", {}),
    ("LocalLeap 0.9/0.75 r=4", "dllm-localleap", {}),
    ("FreeDave, chain of 4 (lossless)", "dllm-freedave", {"branch_slots": 1, "branch_tokens": 1}),
    ("FreeDave, tree of 4 (lossless)", "dllm-freedave", {}),
]

CODE_POLICIES = [
    ("one per step", "dllm-lowconf", {}),
    ("two per step", "dllm-lowconf", {"steps": 32}),
    ("threshold 0.9", "dllm-threshold", {"threshold": 0.9}),
    ("threshold 0.7", "dllm-threshold", {"threshold": 0.7}),
    ("threshold 0.5", "dllm-threshold", {"threshold": 0.5}),
    ("factor 1.0", "dllm-threshold", {"factor": 1.0}),
    ("Prophet", "dllm-prophet", {}),
    ("SchED", "dllm-sched", {}),
    ("LocalLeap", "dllm-localleap", {}),
    ("FreeDave, chain of 4 (lossless)", "dllm-freedave", {"branch_slots": 1, "branch_tokens": 1}),
    ("FreeDave, tree of 4 (lossless)", "dllm-freedave", {}),
    ("FreeDave, tree of 8 (lossless)", "dllm-freedave", {"draft_steps": 8}),
]


CHAT_POLICIES = [
    ("one per step", "dllm-lowconf", {}),
    ("threshold 0.9", "dllm-threshold", {"threshold": 0.9}),
    ("threshold 0.7", "dllm-threshold", {"threshold": 0.7}),
    ("factor 1.0", "dllm-threshold", {"factor": 1.0}),
    ("LocalLeap", "dllm-localleap", {}),
    ("Prophet", "dllm-prophet", {}),
    ("SchED", "dllm-sched", {}),
    ("FreeDave, chain of 4 (lossless)", "dllm-freedave", {"branch_slots": 1, "branch_tokens": 1}),
    ("FreeDave, tree of 4 (lossless)", "dllm-freedave", {}),
    ("FreeDave, tree of 8 (lossless)", "dllm-freedave", {"draft_steps": 8}),
    ("LLaDA 2.1 editing, defaults (0.7 / 0.5 / 16)", "dllm-llada21-edit", {}),
    ("LLaDA 2.1 editing, edit threshold 0.9", "dllm-llada21-edit", {"edit_threshold": 0.9}),
    ("R2-dLLM, defaults", "dllm-r2", {}),
    ("AdaBlock-dLLM, defaults (0.9 / delimiter 0.3)", "dllm-adablock", {}),
    ("ETE, defaults (0.9 / budget 1 nat / 2 explored)", "dllm-ete", {}),
    ("Fast-dLLM v2, sub-block cache (8 / 0.9)", "dllm-fastv2", {}),
    ("Fast-dLLM v2, no cache (8 / 0.9)", "dllm-fastv2", {"cache": "none"}),
    ("dParallel entropy 0.5 nats", "dllm-dparallel", {}),
    ("dParallel entropy 1.0 nats", "dllm-dparallel", {"threshold": 1.0}),
]

# dllm-learn2pd needs a filter trained for the chat target (no smollm2-dllm filter ships): --learn2pd DIR
LEARN2PD_POLICIES = [
    ("Learn2PD, defaults (0.9 / end 0.9)", "dllm-learn2pd", {}),
    ("Learn2PD, threshold 0.8", "dllm-learn2pd", {"threshold": 0.8}),
    ("Learn2PD, threshold 0.7", "dllm-learn2pd", {"threshold": 0.7}),
]


def only(policies: list, methods: str | None) -> list:
    """The policies whose method is in the comma-separated `methods` (None: all), one-per-step kept:
    every other row is read against it."""
    if not methods:
        return policies
    keep = {m.strip() for m in methods.split(",")}
    unknown = keep - {m for _, m, _ in policies}
    if unknown:
        raise SystemExit(f"--policies: {sorted(unknown)} not in this table; it has "
                         f"{', '.join(sorted({m for _, m, _ in policies}))}")
    return [row for row in policies if row[1] in keep or (row[1], row[2]) == ONE_PER_STEP]


def digits_table(n: int, target: str = "digits-dllm") -> str:
    model, tok = speclab.load(target)
    prompts = digits.eval_prompts(n)
    rows = []
    for label, method, kw in tqdm(DIGIT_POLICIES, desc="digits policies"):
        ok = {"ADD": 0, "SUM": 0}
        fwd, t0 = 0, time.perf_counter()
        for p in prompts:
            r = speclab.run((model, tok), p["prompt"], method, gen_length=digits.ANSWER_LEN, record=None, **kw)
            ok[p["task"]] += digits.check(p["prompt"], tok.decode(r.ids))
            fwd += r.trace.totals.target_forwards
        rows.append(f"| {label} | `{method}` {_kw(kw)} | {ok['ADD'] / n:.3f} | {ok['SUM'] / n:.3f} | "
                    f"{fwd / len(prompts):.2f} | {time.perf_counter() - t0:.1f} |")
    head = ("| policy | method | ADD exact | SUM valid | forwards / answer | wall s |\n"
            "|---|---|---|---|---|---|")
    return f"digits-dllm, {n} held-out ADD + {n} SUM prompts, greedy, gen_length 8\n\n{head}\n" + "\n".join(rows)


def code_table(n: int, gen_length: int = 64, block_length: int = 32, target: str = "code-dllm") -> str:
    from speclab.prompts import load_prompts
    prompts = [p[-600:] for p in load_prompts("code-complete", n)]
    return canvas_table(target, prompts, "code-complete prompts (last 600 characters)", False, gen_length,
                        block_length, CODE_POLICIES)


def chat_table(n: int, gen_length: int = 64, block_length: int = 32, target: str = "smollm2-dllm",
               base: str = "smollm2-135m", policies: str | None = None) -> str:
    """smollm2-dllm on the bench's chat questions (none of them is in its training text)."""
    from speclab.prompts import load_prompts
    questions = [p["chat"] for p in load_prompts("chat", n)]
    table = canvas_table(target, questions, "held-out chat questions (chat template)", True,
                         gen_length, block_length, only(CHAT_POLICIES, policies))
    return table + "\n\n" + ar_confidence(base, questions, gen_length)


@torch.inference_mode()
def ar_confidence(base: str, questions: list[str], gen_length: int) -> str:
    """The base model's own top-1 probability along its greedy answers. Threshold 0.9 commits a
    slot beside the step's forced one only at p >= 0.9, and a slot that sees less of the answer than
    the AR model does (the whole left context) is rarely surer than it, so about the share below
    0.9 of the positions each costs a forward of its own: roughly a floor on threshold 0.9's
    forwards per token for this base (not a strict bound)."""
    model, tok = speclab.load(base)
    ps = []
    for q in questions:
        r = speclab.run((model, tok), q, "ar", chat=True, max_new_tokens=gen_length, record=None)
        ids = r.trace.prompt_ids + r.ids
        logits = model(torch.tensor([ids])).logits[0, len(r.trace.prompt_ids) - 1:-1].float()
        ps.append(logits.softmax(-1).amax(-1))
    p = torch.cat(ps)
    return (f"{base} `ar` on the same questions, {len(p)} positions: mean top-1 p {p.mean():.3f}, "
            f"p >= 0.9 {(p >= 0.9).float().mean():.3f}, p >= 0.7 {(p >= 0.7).float().mean():.3f}: "
            f"threshold 0.9 needs about {(p < 0.9).float().mean():.2f} forwards per token or more on this base")


def canvas_table(target: str, prompts: list[str], what: str, chat: bool, gen_length: int, block_length: int,
                 policies) -> str:
    """Forwards per token, tokens per forward, wall tokens/s and agreement with one-per-step decoding."""
    model, tok = speclab.load(target)
    kw0 = dict(gen_length=gen_length, block_length=block_length, record=None, **({"chat": True} if chat else {}))
    ref_traces = [speclab.run((model, tok), p, ONE_PER_STEP[0], **{**kw0, "record": "light"}).trace
                  for p in tqdm(prompts, desc="reference")]
    ref = [t.output_ids for t in ref_traces]
    rows = []
    for label, method, kw in tqdm(policies, desc=f"{target} policies"):
        fwd = toks = same_pos = n_pos = identical = 0
        t0 = time.perf_counter()
        for p, want in zip(prompts, ref):
            r = speclab.run((model, tok), p, method, **kw0, **kw)
            fwd, toks = fwd + r.trace.totals.target_forwards, toks + len(r.ids)
            m = min(len(r.ids), len(want))
            same_pos += sum(a == b for a, b in zip(r.ids[:m], want[:m]))
            n_pos += max(len(r.ids), len(want))
            identical += r.ids == want
        wall = time.perf_counter() - t0
        rows.append(f"| {label} | `{method}` {_kw(kw)} | {fwd / toks:.3f} | {toks / fwd:.2f} | {toks / wall:.1f} | "
                    f"{same_pos / n_pos:.3f} | {identical}/{len(prompts)} |")
    head = ("| policy | method | forwards / token | tokens / forward | tokens / s | positions equal to one-per-step "
            "| identical outputs |\n|---|---|---|---|---|---|---|")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return (f"{target} ({dtype}), {len(prompts)} {what}, gen_length {gen_length}, block_length {block_length}, "
            f"greedy\n\n{head}\n" + "\n".join(rows) + "\n\n" + frontier_table(ref_traces))


def frontier_table(traces, depth: int = 6) -> str:
    """Per distance d from the frontier (the d-th still-masked slot of the active block), over every
    step of the given runs: mean top-1 probability, the share of steps a 0.9 / 0.7 threshold would
    commit it, and the share whose top-1 is the token the run finally wrote there."""
    conf = [[] for _ in range(depth)]
    right = [[] for _ in range(depth)]
    for t in traces:
        final = t.output_ids
        for st in t.denoise:
            lo, hi = st.block
            inside = [(p, c, y) for p, c, y in zip(st.masked, st.conf, st.top1) if lo <= p < hi]
            for d, (p, c, y) in enumerate(inside[:depth]):
                conf[d].append(c)
                right[d].append(p < len(final) and final[p] == y)
    rows = [f"| {d + 1} | {len(c)} | {sum(c) / len(c):.3f} | {sum(x >= 0.9 for x in c) / len(c):.3f} | "
            f"{sum(x >= 0.7 for x in c) / len(c):.3f} | {sum(r) / len(r):.3f} |"
            for d, (c, r) in enumerate(zip(conf, right)) if c]
    return ("confidence by distance from the frontier (one-per-step runs, every step)\n\n"
            "| d-th masked slot | steps | mean top-1 p | p >= 0.9 | p >= 0.7 | top-1 = final token |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows))


SWEEP = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)      # dllm-threshold's curve in the report's plot


def forward_rows(trace) -> float:
    """Model rows a run computed, one per canvas a forward read: a plain step is one row, FreeDave's
    batched verify of K drafts K rows (it counts as one target forward). A step that names the
    token rows its forward ran (info["rows"]: dllm-fastv2's sub-block forward, or its forward with
    no cache, which runs the committed text again) counts rows / block_length."""
    extra = sum(st.info.get("drafts", 1) - 1 for st in trace.denoise if st.info.get("verified_forward"))
    B = trace.params.get("block_length") or 1
    extra += sum(st.info["rows"] / B - 1 for st in trace.denoise if "rows" in st.info)
    return trace.totals.target_forwards + extra


def content_length(ids: list[int], eos_id: int | None) -> int:
    """Tokens of an answer up to and including its end of text (all of them when it has none)."""
    return ids.index(eos_id) + 1 if eos_id is not None and eos_id in ids else len(ids)


@torch.inference_mode()
def target_nll(model, prompt_ids: list[int], answer: list[int]) -> tuple[float, int]:
    """The AR target's negative log-likelihood of `answer` after `prompt_ids`: (sum, tokens)."""
    if not answer:
        return 0.0, 0
    ids = torch.tensor([prompt_ids + answer], device=next(model.parameters()).device)
    logp = model(ids).logits[0, len(prompt_ids) - 1:-1].float().log_softmax(-1)
    return float(-logp.gather(-1, ids[0, len(prompt_ids):, None]).sum()), len(answer)


def report(target: str, base: str, sets: list[str], n: int, gen_length: int = 64, block_length: int = 32,
           policies: str | None = None, sweep: tuple = SWEEP, on_row=None, done: dict | None = None) -> dict:
    """The diffusion report per prompt set: for every policy (and a threshold sweep), content tokens
    (the one-per-step answer up to its end of text) per forward row, positions equal to one-per-step,
    the AR target's NLL per token of what it wrote, wall tokens per second; `ar` on the AR target
    beside them. Returns {set: [row, ...]} (rows as dicts); on_row(rows so far), when given, after
    every row (main writes the JSON there, so a report stopped part way keeps its finished rows).
    done: a report's rows so far ({set: rows}, `--resume`): their policies are kept, not run again."""
    from speclab.prompts import load_prompts
    model, tok = speclab.load(target)
    ar_model, ar_tok = speclab.load(base)
    rows_by_set = {}
    table = only(CHAT_POLICIES, policies) + [(f"threshold {t} (sweep)", "dllm-threshold", {"threshold": t})
                                             for t in sweep if t not in (0.9, 0.7)]
    for name in sets:
        raw = load_prompts(name, n)
        chat = isinstance(raw[0], dict)
        prompts = [p["chat"] if chat else p[-600:] for p in raw]
        kw0 = dict(gen_length=gen_length, block_length=block_length, record="light", **({"chat": True} if chat else {}))
        refs = [speclab.run((model, tok), p, ONE_PER_STEP[0], **kw0).trace for p in tqdm(prompts, desc=f"{name}: reference")]
        eos = tok.eos_token_id
        content = [content_length(t.output_ids, eos) for t in refs]
        rows = rows_by_set[name] = list((done or {}).get(name, []))
        have = {r["policy"] for r in rows}
        for label, method, kw in tqdm([t for t in table if t[0] not in have], desc=f"{name}: policies"):
            fwd = same = npos = toks = nfe = 0
            nll = nll_n = wall = 0.0
            for p, ref in zip(prompts, refs):
                r = speclab.run((model, tok), p, method, **kw0, **kw)
                fwd += forward_rows(r.trace)
                nfe += r.trace.totals.target_forwards
                toks += len(r.ids)
                wall += r.trace.totals.wall_s
                want = ref.output_ids
                m = min(len(r.ids), len(want))
                same += sum(a == b for a, b in zip(r.ids[:m], want[:m]))
                npos += max(len(r.ids), len(want))
                a, k = target_nll(ar_model, r.trace.prompt_ids, r.ids[:content_length(r.ids, eos)])
                nll, nll_n = nll + a, nll_n + k
            rows.append(dict(policy=label, method=method, params=kw, content_per_row=round(sum(content) / fwd, 3),
                             positions_equal=round(same / npos, 3), nll_per_token=round(nll / max(nll_n, 1), 3),
                             tokens_per_s=round(toks / wall, 1), wall_s=round(wall, 2), forward_rows=round(fwd, 2),
                             forwards=nfe, content_tokens=sum(content)))
            if on_row is not None:
                on_row(rows_by_set)
        if f"ar on {base}" in have:
            continue
        ar_wall = ar_toks = 0.0
        ar_nll = ar_n = 0.0
        for p in prompts:
            r = speclab.run((ar_model, ar_tok), p, "ar", max_new_tokens=gen_length, record=None,
                            **({"chat": True} if chat else {}))
            ar_wall, ar_toks = ar_wall + r.trace.totals.wall_s, ar_toks + len(r.ids)
            a, k = target_nll(ar_model, r.trace.prompt_ids, r.ids[:content_length(r.ids, ar_tok.eos_token_id)])
            ar_nll, ar_n = ar_nll + a, ar_n + k
        rows.append(dict(policy=f"ar on {base}", method="ar", params={}, content_per_row=1.0, positions_equal=None,
                         nll_per_token=round(ar_nll / max(ar_n, 1), 3), tokens_per_s=round(ar_toks / ar_wall, 1),
                         forward_rows=None, content_tokens=None))
        if on_row is not None:
            on_row(rows_by_set)
    return rows_by_set


def write_json(rows_by_set: dict, path: str) -> None:
    """The report's rows as JSON, replaced whole (never a half-written file)."""
    import json
    import os
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(rows_by_set, f, indent=1)
    os.replace(path + ".tmp", path)


def report_markdown(rows_by_set: dict, target: str, n: int, gen_length: int, block_length: int) -> str:
    out = []
    for name, rows in rows_by_set.items():
        out.append(f"{target}, {n} {name} prompts, gen_length {gen_length}, block_length {block_length}, greedy\n\n"
                   "| policy | method | content tokens / forward row | positions equal to one-per-step | "
                   "AR target NLL / token | tokens / s |\n|---|---|---|---|---|---|")
        for r in rows:
            eq = "-" if r["positions_equal"] is None else f"{r['positions_equal']:.3f}"
            out.append(f"| {r['policy']} | `{r['method']}` {_kw(r['params'])} | {r['content_per_row']:.3f} | {eq} | "
                       f"{r['nll_per_token']:.3f} | {r['tokens_per_s']:.1f} |")
        out.append("")
    return "\n".join(out)


def merge(paths: list[str]) -> dict:
    """Reports run apart (a process per prompt set, or a set's policies split over runs) as one
    {set: rows}; a policy of a set in two of them is an error."""
    import json
    rows_by_set: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for name, rows in json.load(f).items():
                have = {r["policy"] for r in rows_by_set.get(name, [])}
                twice = sorted(have & {r["policy"] for r in rows})
                if twice:
                    raise ValueError(f"{name!r}: the policies {twice} are in more than one of {paths}: merge each once")
                rows_by_set.setdefault(name, []).extend(rows)
    return rows_by_set


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500, help="held-out prompts per digits task")
    ap.add_argument("--code-prompts", type=int, default=20)
    ap.add_argument("--chat-prompts", type=int, default=0, help="smollm2-dllm on held-out chat questions")
    ap.add_argument("--only-chat", action="store_true", help="skip the digits and code tables")
    ap.add_argument("--chat-target", default="smollm2-dllm", help="the block-diffusion model of the chat table")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--policies", help="the chat table's rows for these methods only, comma-separated "
                                       "(one-per-step always runs: the rows are read against it)")
    ap.add_argument("--report", metavar="SETS", help="the diffusion report on these prompt sets (e.g. chat,code-edit): "
                                                      "every policy and a threshold sweep, content tokens per forward "
                                                      "row, agreement, the AR target's NLL, tokens / s, ar beside them")
    ap.add_argument("--report-prompts", type=int, default=20)
    ap.add_argument("--sweep", default=",".join(map(str, SWEEP)),
                    help="the report's dllm-threshold sweep, comma-separated thresholds ('none': no sweep)")
    ap.add_argument("--base", default="smollm2-135m", help="the AR target the report scores the text with")
    ap.add_argument("--json", help="the report's rows as JSON here")
    ap.add_argument("--plot", help="the report's sweep plot: .html (offline, plotly.js inside) or .png (Chromium)")
    ap.add_argument("--merge", metavar="JSON,JSON", help="no runs: the reports in these --json files (a process per "
                                                         "prompt set) as one: its tables, --json and --plot")
    ap.add_argument("--resume", action="store_true", help="with --report and --json: keep the rows already in the "
                                                          "--json file and run only the policies it lacks")
    ap.add_argument("--learn2pd", metavar="DIR", help="add dllm-learn2pd rows with this filter "
                                                     "(`speclab train learn2pd --out DIR`)")
    a = ap.parse_args(argv)
    if a.learn2pd:
        CHAT_POLICIES.extend((label, m, dict(kw, filter=a.learn2pd)) for label, m, kw in LEARN2PD_POLICIES)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.report or a.merge:
        sweep = () if a.sweep.strip().lower() in ("", "none") else tuple(float(t) for t in a.sweep.split(","))
        if a.resume and not (a.report and a.json):
            raise SystemExit("--resume continues a report in its --json file: give --report SETS --json FILE")
        done = merge([a.json]) if a.resume and os.path.exists(a.json) else None
        rows = merge(a.merge.split(",")) if a.merge else report(
            a.chat_target, a.base, a.report.split(","), a.report_prompts, policies=a.policies, sweep=sweep,
            on_row=(lambda r: write_json(r, a.json)) if a.json else None, done=done)
        print(report_markdown(rows, a.chat_target, a.report_prompts, 64, 32))
        for name, set_rows in rows.items():
            print(f"\n{name}: above dllm-threshold's curve: {', '.join(above_curve(set_rows)) or 'none'}")
        if a.json:
            write_json(rows, a.json)
        if a.plot:
            save_plot(sweep_figure(rows), a.plot)
        return
    if not a.only_chat:
        print(digits_table(a.n))
        if a.code_prompts:
            print()
            print(code_table(a.code_prompts))
    if a.chat_prompts:
        print()
        print(chat_table(a.chat_prompts, target=a.chat_target, policies=a.policies))



if __name__ == "__main__":
    main()
