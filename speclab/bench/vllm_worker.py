"""Runs a prompt set through vLLM at batch 1 and writes what it measured as JSON.

This file is executed by the interpreter of the vLLM venv (`make vllm` builds .venv-vllm), never
imported by speclab: it uses only the standard library and vllm, so it runs where speclab is not
installed. speclab.bench.vllm_peer writes the request, starts this script once per peer, and reads
the response.

    .venv-vllm/bin/python speclab/bench/vllm_worker.py request.json response.json

request.json:
  model              a plain safetensors directory (config.json + model.safetensors + tokenizer)
  dtype              "bfloat16" | "float32" | "float16"
  prompts            [[token id, ...], ...]   (already templated and encoded by speclab)
  max_tokens         new tokens per prompt (greedy; stops earlier at eos_id)
  eos_id             the token that ends generation (SmolLM2: 2, <|im_end|>), or null
  speculative_config null (plain greedy) or vLLM's dict, e.g. {"method": "ngram", ...}
  warmup             warm-up generations before timing (default 2; on the first prompt reversed)
  repeats            timed passes over the prompts (default 1)
  max_model_len, kv_cache_gib, enforce_eager, seed  (optional)

response.json: {"vllm_version", "load_s", "metric_names", "results": [per prompt], "passes": [results
of each pass]} with, per prompt,
  ids            generated token ids (the EOS included when it ended the text, as in speclab)
  wall_s         seconds around llm.generate() of this prompt alone
  finish_reason  "stop" (EOS) or "length"
  spec           vLLM's per-request speculative-decoding metrics (RequestSpecDecodeMetrics.to_dict
                 at the "detailed" level: per_step_accepted / per_step_drafted per verify step,
                 acceptance_histogram, ...), null without speculative decoding
  counters       the change in vLLM's aggregate vllm:spec_decode_* counters over this prompt
                 (drafts, draft tokens, accepted tokens, accepted tokens per position)
On failure the response is {"error": "..."} and the exit code is 1.
"""
import json
import os
import sys
import time
import traceback

SPEC_PREFIX = "vllm:spec_decode"


def spec_counters(llm) -> dict:
    """vLLM's aggregate vllm:spec_decode_* metrics: name -> int, or list of ints (per position)."""
    out = {}
    for m in llm.get_metrics():
        if not m.name.startswith(SPEC_PREFIX):
            continue
        if hasattr(m, "values"):                         # Vector: accepted tokens per position
            prev = out.get(m.name, [0] * len(m.values))
            out[m.name] = [a + b for a, b in zip(prev, m.values)]
        elif hasattr(m, "value"):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


def delta(after: dict, before: dict) -> dict:
    d = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, list):
            b = b or [0] * len(v)
            d[k] = [x - y for x, y in zip(v, b)]
        else:
            d[k] = v - (b or 0)
    return d


def main(req_path: str, out_path: str) -> int:
    req = json.load(open(req_path))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(req.get("kv_cache_gib", 2)))
    from vllm import LLM, SamplingParams
    from vllm import __version__ as vllm_version
    from vllm.inputs import TokensPrompt

    prompts = req["prompts"]
    spec = req.get("speculative_config")
    kw = dict(model=req["model"], dtype=req.get("dtype", "bfloat16"), seed=req.get("seed", 0),
              enable_prefix_caching=False,        # every prompt prefilled in full, as speclab does
              disable_log_stats=False)            # keeps the vllm:spec_decode_* counters
    if req.get("max_model_len"):
        kw["max_model_len"] = int(req["max_model_len"])
    if req.get("enforce_eager"):
        kw["enforce_eager"] = True
    if spec:
        kw["speculative_config"] = spec
        kw["per_request_spec_decode_metrics"] = "detailed"
    t0 = time.perf_counter()
    llm = LLM(**kw)
    load_s = time.perf_counter() - t0

    eos = req.get("eos_id")
    params = dict(temperature=0.0, max_tokens=int(req["max_tokens"]), detokenize=False)
    if eos is not None:
        params["stop_token_ids"] = [int(eos)]
    sp = SamplingParams(**params)

    def one(ids, sp=sp):
        return llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0].outputs[0]

    # warm-up on the first prompt reversed: every code path runs, and suffix decoding's global tree
    # (which keeps earlier outputs) does not see the start of a timed prompt's answer
    warm = SamplingParams(**{**params, "max_tokens": min(16, int(req["max_tokens"]))})
    for _ in range(int(req.get("warmup", 2))):
        one(list(reversed(prompts[0])), warm)

    passes = []
    for _ in range(int(req.get("repeats", 1))):      # passes outer, prompts inner, as speclab's bench
        results = []
        for ids in prompts:
            before = spec_counters(llm)
            t = time.perf_counter()
            out = one(ids)
            wall = time.perf_counter() - t
            sdm = getattr(out, "spec_decode_metrics", None)
            results.append(dict(ids=list(out.token_ids), wall_s=wall, finish_reason=out.finish_reason,
                                spec=sdm.to_dict() if sdm is not None else None,
                                counters=delta(spec_counters(llm), before)))
        passes.append(results)
    names = sorted({m.name for m in llm.get_metrics() if m.name.startswith(SPEC_PREFIX)})
    json.dump(dict(vllm_version=vllm_version, load_s=load_s, metric_names=names, results=passes[0],
                   passes=passes), open(out_path, "w"))
    return 0


if __name__ == "__main__":                 # vLLM starts worker processes: keep LLM() under this guard
    req_path, out_path = sys.argv[1], sys.argv[2]
    try:
        code = main(req_path, out_path)
    except BaseException as e:             # the parent reads this file, not our (long) log
        tb = traceback.format_exc()
        json.dump({"error": f"{type(e).__name__}: {e}", "traceback": tb}, open(out_path, "w"))
        print(tb, file=sys.stderr)
        code = 1
    sys.exit(code)
