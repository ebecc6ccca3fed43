"""`speclens serve`: the engine as an OpenAI-, Anthropic- and llama-server-compatible server on loopback, with
Predicted Outputs.

    speclens serve                                   # the default pair, Auto, http://127.0.0.1:8000/v1
    speclens serve --target T.gguf --draft D.gguf --port 8080 --api-key KEY
    speclens serve -c 0                              # the model's whole context, for agents' long prompts

Any OpenAI client works: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="KEY or anything")``. A request's
``prediction`` (the text the answer is expected to repeat, e.g. the file being edited) is drafted from losslessly.
Agents offer ``tools`` and get ``tool_calls`` back, through chat completions, the Responses API (Codex) or
Anthropic's Messages API (Claude Code: ``ANTHROPIC_BASE_URL=http://127.0.0.1:8000``). Clients made for llama-server
work through its own endpoints: ``/infill`` (llama.vim, llama.vscode, completing at the cursor), ``/completion``
(Continue's llama.cpp provider), ``/tokenize``, ``/detokenize``, ``/apply-template`` and ``/props``.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from pathlib import Path

from core.bench.modes import BenchError, strategy_for
from core.cli_args import add_pair_arguments, open_pair
from core.serve.background import check_bindable

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speclens serve", description=__doc__.split("\n\n")[0])
    add_pair_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--strategy", default="auto", help="how to decode: auto (default), baseline, chain:K, memory, ... "
                   "(the names `speclens bench --modes` takes)")
    p.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                   help="tokens a prompt and its answer may fill, as llama-server's option (default 4096 or less; 0: "
                        "all the model was trained with; agents' prompts want 16k or more)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (needed "
                   "off loopback)")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait; more get 503 + Retry-After")
    p.add_argument("--model-name", default=None, help="the model id clients ask for (default: the target's file)")
    p.add_argument("--memory", choices=("session", "off"), default="session",
                   help="session: draft also from the answers served since start; off: only from a request's own "
                        "text and prediction (benchmarks)")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(host: str, port: int, api_key: str | None) -> None:
    """Refuse what would expose the models unprotected, or cannot be bound; ValueError says why."""
    if not is_loopback(host) and not api_key:
        raise ValueError(f"listening on {host} lets other machines use your models: pass --api-key KEY (or use the "
                         "default --host 127.0.0.1)")
    if not 0 < port < 65536:
        raise ValueError(f"--port must be 1..65535, got {port}")
    try:
        check_bindable(host, port)
    except OSError as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def warm_for_requests(models) -> None:
    """Warm the pair, and let Auto measure (or load) its plans for greedy and for sampled requests, before the first
    request rather than during it."""
    from core.sampling import SamplingParams
    from core.warmup import warm

    for sampling in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)):
        warm(models.target, models.draft, models.strategy, sampling)


def model_name(target) -> str:
    return Path(target.name).name.removesuffix(".gguf")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="speclens serve: %(levelname)s %(message)s")
    args = parser().parse_args(argv)
    try:
        check_address(args.host, args.port, args.api_key)
        strategy = strategy_for(args.strategy)
        if args.max_queue < 0:
            raise ValueError("--max-queue must be at least 0")
    except (ValueError, BenchError) as exc:
        print(f"speclens serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from core.serve.executor import JobThread
    from core.serve.http import create_app
    from core.serve.job import ServedModels

    engine = JobThread()
    try:
        print("speclens serve: loading the models ...", file=sys.stderr, flush=True)
        target, draft = engine.submit(lambda: open_pair(args.pair, args.backend, args.draft_backend, args.device,
                                                        args.target, args.draft, args.ctx_size)).result()
        models = ServedModels(target, draft, strategy, args.model_name or model_name(target),
                              remember_answers=args.memory == "session")
        engine.submit(lambda: warm_for_requests(models)).result()
    except Exception as exc:   # a model that will not load: one clear line
        engine.close()
        print(f"speclens serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(models, engine, api_key=args.api_key, max_queue=args.max_queue)
    print(f"speclens serve: {models.name} ({models.strategy.label}, a context of {target.context_length} tokens) "
          f"at http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).run()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
