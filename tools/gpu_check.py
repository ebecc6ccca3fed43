"""One prepared run on a lent GPU (issue 12): what can be measured there without the real weights.

The default pair's GGUF files (1.6 GB) cannot travel to the device machine (64 MiB per call, no network there), so
this script builds Qwen2.5-Coder-1.5B- and 0.5B-shaped models with random bfloat16 weights. Speeds do not depend on
the weights' values, so plain decoding speeds and the cost model are real; acceptance does, so no speculative
speedup is claimed from it. It prints one JSON document: transformers' own greedy ``generate`` against SpecLens's
Baseline (static cache, CUDA graphs), the verify latency profile t(n)/t(1) for n = 1..256 and the draft's cost, the
Sequoia plan those latencies give for the acceptance vector measured on the CPU with the real pair (a prediction,
labelled so), and greedy identity of speculative decoding on the card (tiny bf16 pair).

Run: ``python tools/gpu_check.py > gpu.json`` on a machine with CUDA (``DEV=cpu`` for a dry run of the logic).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from core.auto.costs import Latencies  # noqa: E402
from core.auto.plan import best_plan  # noqa: E402
from core.backends.hf import HFBackend  # noqa: E402
from core.divergence import compare_greedy  # noqa: E402
from core.drafting import Baseline, Chain, Tree  # noqa: E402
from core.engine import SpeculativeEngine  # noqa: E402
from core.sampling import SamplingParams  # noqa: E402
from core.sequoia import solve  # noqa: E402
from core.tiny import perturb, tiny_model  # noqa: E402
from core.tree import TokenTree  # noqa: E402

DEV = os.environ.get("DEV", "cuda")
SMALL = DEV != "cuda"   # a dry run on a CPU uses small shapes
SHAPES = {  # Qwen2.5-Coder configs (hidden, layers, heads, kv heads, intermediate)
    "1.5B": (1536, 28, 12, 2, 8960), "0.5B": (896, 24, 14, 2, 4864)}
VOCAB = 151936
CPU_ACCEPTANCE = (0.833, 0.062, 0.042, 0.021)   # `speclens plan` on the real pair, llama.cpp, greedy (docs/)
NEW_TOKENS = 128
out: dict = {"device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
             "torch": torch.__version__}


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def qwen(shape: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter = SHAPES[shape]
    if SMALL:
        hidden, layers, heads, kv, inter = 128, 2, 4, 2, 256
    config = Qwen2Config(vocab_size=VOCAB if not SMALL else 512, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                         max_position_embeddings=4096, tie_word_embeddings=shape == "0.5B")
    with torch.device(DEV):
        model = Qwen2ForCausalLM(config)
    return model.to(torch.bfloat16 if DEV == "cuda" else torch.float32).eval()


def hf_generate(model, prompt: list[int]) -> float:
    ids = torch.tensor([prompt], device=DEV)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, min_new_tokens=8)
        sync()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                       min_new_tokens=NEW_TOKENS)
        sync()
    return NEW_TOKENS / (time.perf_counter() - t0)


def time_tree(backend, context: list[int], n: int, repeats: int = 5) -> float:
    backend.prefill(context)
    chain = TokenTree.chain([context[i % len(context)] for i in range(n)])
    times = []
    for _ in range(repeats + 2):
        sync()
        t0 = time.perf_counter()
        backend.forward_tree(chain)[n - 1]
        sync()
        times.append(time.perf_counter() - t0)
        backend.commit([])
    return min(times[2:])


def section(name, fn):
    t0 = time.perf_counter()
    try:
        out[name] = fn()
    except Exception as exc:  # one failing part must not lose the others' numbers
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    out[name + "_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)


def plain_speeds():
    torch.manual_seed(0)
    target = qwen("1.5B")
    prompt = [int(t) for t in torch.randint(0, 500, (200,))]
    reference = hf_generate(target, prompt)
    backend = HFBackend(target, device=DEV, name="1.5B-shape")
    engine = SpeculativeEngine(backend, None, Baseline(), SamplingParams(temperature=0.0))
    engine.generate(prompt, 8)
    result = engine.generate(prompt, NEW_TOKENS)
    return {"transformers_generate_tok_s": reference, "speclens_baseline_tok_s": result.stats.tokens_per_second,
            "speclens_python_ms_per_step": 1000 * result.stats.overhead_seconds / result.stats.target_calls}


def profile():
    torch.manual_seed(1)
    target = HFBackend(qwen("1.5B"), device=DEV, name="1.5B-shape")
    draft = HFBackend(qwen("0.5B"), device=DEV, name="0.5B-shape")
    context = [int(t) for t in torch.randint(0, 500, (500,))]
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256) if not SMALL else (1, 2, 4, 8)
    verify = {n: time_tree(target, context, n) for n in sizes}
    drafted = {w: time_tree(draft, context, w) for w in (1, 2, 4, 8, 16)}
    lat = Latencies(verify, drafted)
    plan = best_plan(solve(CPU_ACCEPTANCE, min(128, max(sizes)), 12), lat)
    return {"verify_ms": {n: 1000 * t for n, t in verify.items()}, "ratios": lat.ratios(),
            "draft_ms": {w: 1000 * t for w, t in drafted.items()}, "draft_over_target": lat.draft_cost(1) / lat.plain,
            "predicted_plan_with_cpu_acceptance": {"budget": plan.budget, "depth": plan.depth,
                                                    "tokens_per_call": plan.expected_tokens,
                                                    "predicted_speedup": plan.speedup}}


def identity():
    results = {}
    for dtype in (torch.float64, torch.bfloat16):
        target = tiny_model(64, 5, dtype=dtype, context=1024)
        draft = perturb(target, 0.05, 6)
        t, d = HFBackend(target, device=DEV, name="t"), HFBackend(draft, device=DEV, name="d")
        greedy = SamplingParams(temperature=0.0)
        found = []
        for seed in range(6):
            prompt = [int(x) for x in torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(seed))]
            base = SpeculativeEngine(t, d, Baseline(), greedy).generate(prompt, 40)
            for strategy in (Chain(4), Tree((-1, -1, 0, 0, 1, 2))):
                found.append(compare_greedy(base, SpeculativeEngine(t, d, strategy, greedy).generate(prompt, 40)))
        results[str(dtype)] = {"identical": sum(c.identical for c in found), "runs": len(found),
                               "divergences": [c.describe() for c in found if not c.identical]}
    return results


section("plain", plain_speeds)
section("profile", profile)
section("identity", identity)
print(json.dumps(out, indent=1))
