"""What a benchmark run says: per-prompt ratios, their spread over repeats, summaries and the Markdown table.

The speed compared is decode tokens per second (after the first token; the time to the first token is reported
apart), from engine timestamps for the engine's modes and from the same two instants for the runners. A mode's
ratio to a reference on one prompt is the median over repeats of the ratio within each repeat; a summary is the
geometric mean of those medians over prompts. The spread says how far single repeats moved, so that a 1.05x can be
told from noise.

Besides SpecLens's own baseline, every mode is reported over each outside reference that ran (``native``, llama.cpp's
own server plain) and over llama-server's best configuration: the llama-server mode with the highest geomean over
llama-server plain, for all prompts and for each set.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Sequence

from core.bench.modes import LLAMA_SERVER, LLAMA_SERVER_MODES, NATIVE

METRIC = "decode_tokens_per_s"
REFERENCES = {NATIVE: "native", LLAMA_SERVER: "llama_server"}   # mode -> its key in a summary ("over_<key>")
BEST = "llama_server_best"


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def _speeds(runs: list[dict], surface: str) -> dict:
    """(mode, set, prompt) -> {repeat: decode tok/s} on one surface."""
    out: dict = defaultdict(dict)
    for r in runs:
        if r["surface"] == surface:
            out[(r["mode"], r["prompt_set"], r["prompt_id"])][r["repeat"]] = r[METRIC]
    return out


def ratios(runs: list[dict], mode: str, reference: str, surface: str = "engine") -> dict:
    """(set, prompt) -> the per-repeat ratios of ``mode`` to ``reference`` (same prompt, same repeat)."""
    speeds = _speeds(runs, surface)
    out = {}
    for (m, pset, pid), by_repeat in speeds.items():
        ref = speeds.get((reference, pset, pid), {})
        values = [v / ref[k] for k, v in sorted(by_repeat.items()) if m == mode and ref.get(k)]
        if values:
            out[(pset, pid)] = values
    return out


def _summary_of(per_prompt: dict) -> dict:
    medians = {k: statistics.median(v) for k, v in per_prompt.items()}
    sets = list(dict.fromkeys(pset for pset, _ in medians))
    repeats = max((len(v) for v in per_prompt.values()), default=0)
    by_repeat = [geomean([v[k] for v in per_prompt.values() if len(v) > k]) for k in range(repeats)]
    return {"speedup": geomean(list(medians.values())), "min_speedup": min(medians.values()),
            "max_speedup": max(medians.values()),
            "worst_prompt": min(medians, key=medians.get)[1],
            "by_set": {s: geomean([r for (ps, _), r in medians.items() if ps == s]) for s in sets},
            "by_prompt": {f"{ps}/{pid}": r for (ps, pid), r in medians.items()},
            # how far one repeat's ratio moved around the median: the noise a single run would carry
            "spread": statistics.median([max(v) - min(v) for v in per_prompt.values()]),
            "repeat_geomeans": by_repeat}


def summarise(runs: list[dict], modes: list[str]) -> dict:
    """Per mode: aggregate decode tok/s, ratios to baseline and to native, predictions, the window's cost."""
    summary = {}
    surfaces = list(dict.fromkeys(r["surface"] for r in runs))
    for mode in modes:
        rows = [r for r in runs if r["mode"] == mode and r["surface"] == "engine"]
        decode_s = sum((r["seconds"] - (r["time_to_first_token"] or 0.0)) for r in rows)
        # rows of rounds before first_tokens was recorded counted one
        entry: dict = {"tokens_per_s": sum(max(r["new_tokens"] - r.get("first_tokens", 1), 0) for r in rows)
                       / max(decode_s, 1e-12),
                       "time_to_first_token": statistics.median([r["time_to_first_token"] or 0.0 for r in rows])
                       if rows else None}
        base = ratios(runs, mode, "baseline")
        if base:
            entry.update(_summary_of(base))
        for reference, key in REFERENCES.items():
            over = ratios(runs, mode, reference) if mode != reference else {}
            if over:
                entry[f"over_{key}"] = _summary_of(over)
        best = _over_best_llama_server(runs, mode)
        if best:
            entry[f"over_{BEST}"] = best
        overhead = [r["python_ms_per_step"] for r in rows if "python_ms_per_step" in r]
        if overhead:
            entry["python_ms_per_step"] = statistics.median(overhead)
        predicted = [r["predicted_speedup"] for r in rows if "predicted_speedup" in r]
        if predicted and base:
            entry["predicted_speedup"] = geomean(predicted)
            entry["realised_over_predicted"] = entry["speedup"] / entry["predicted_speedup"]
        scored = [r["same_drafts"] for r in rows if r.get("same_drafts", {}).get("steps")]
        if scored:
            entry["same_drafts"] = _same_drafts_of(scored)
        if "window" in surfaces:
            window = _window_ratios(runs, mode)
            if window:
                entry["window_over_engine"] = geomean([statistics.median(v) for v in window.values()])
                entry["window_over_engine_worst"] = min(statistics.median(v) for v in window.values())
        summary[mode] = entry
    return summary


def _over_best_llama_server(runs: list[dict], mode: str) -> dict:
    """``mode`` over llama-server's best configuration (by geomean over llama-server plain), overall and per set."""
    configs = [m for m in LLAMA_SERVER_MODES if any(r["mode"] == m for r in runs)]
    if LLAMA_SERVER not in configs or mode in configs:
        return {}
    plain = {c: ratios(runs, c, LLAMA_SERVER) if c != LLAMA_SERVER else {} for c in configs}

    def best_for(pset: str | None) -> str:
        def score(c: str) -> float:
            if c == LLAMA_SERVER:
                return 1.0
            return geomean([statistics.median(v) for (ps, _), v in plain[c].items() if pset in (None, ps)])
        return max(configs, key=score)

    best = best_for(None)
    over = ratios(runs, mode, best)
    if not over:
        return {}
    summary = _summary_of(over)
    summary["config"] = best
    sets = list(dict.fromkeys(ps for ps, _ in over))
    summary["by_set"], summary["config_by_set"] = {}, {}
    for pset in sets:
        config = best_for(pset)
        per_set = {k: v for k, v in ratios(runs, mode, config).items() if k[0] == pset}
        summary["by_set"][pset] = geomean([statistics.median(v) for v in per_set.values()])
        summary["config_by_set"][pset] = config
    return summary


def _same_drafts_of(scored: list[dict]) -> dict:
    """Expected accepted tokens per step under each verifier over all runs' steps (core.bench.same_drafts)."""
    steps = sum(s["steps"] for s in scored)
    names = [k for k in scored[0] if k != "steps"]
    return {"steps": steps, **{k: sum(s[k] * s["steps"] for s in scored) / steps for k in names}}


def _window_ratios(runs: list[dict], mode: str) -> dict:
    engine, window = _speeds(runs, "engine"), _speeds(runs, "window")
    out = {}
    for key, by_repeat in window.items():
        if key[0] != mode:
            continue
        values = [v / engine[key][k] for k, v in sorted(by_repeat.items()) if engine.get(key, {}).get(k)]
        if values:
            out[key[1:]] = values
    return out


def _reference_labels(summary: dict) -> list[tuple[str, str]]:
    """(summary key, table label) of every outside reference some mode was measured over."""
    keys = [f"over_{k}" for k in REFERENCES.values()] + [f"over_{BEST}"]
    present = [k for k in keys if any(k in s for s in summary.values())]
    labels = {f"over_{v}": m for m, v in REFERENCES.items()} | {f"over_{BEST}": "llama-server's best"}
    return [(k, labels[k]) for k in present]


def markdown(report: dict) -> str:
    """The Markdown table: median decode tok/s per prompt and mode (ratio to baseline), then the summary rows."""
    meta, modes, runs, summary = report["meta"], report["modes"], report["runs"], report["summary"]
    lines = [f"{meta['pair']} pair, target on {meta['backend']}, draft on {meta['draft_backend']}, "
             f"{meta['max_new_tokens']} new tokens, temperature {meta['temperature']}, {meta['repeat']} repeat(s) "
             f"(median shown), {meta['machine']}" + (f", {meta['llama_cpp']}" if meta.get("llama_cpp") else "")
             + "; decode tokens/s (after the first token)", "",
             "| set | prompt | " + " | ".join(f"{m}" for m in modes) + " |",
             "|---|---|" + "---:|" * len(modes)]
    speeds = _speeds(runs, "engine")
    keys = list(dict.fromkeys((r["prompt_set"], r["prompt_id"]) for r in runs))
    for pset, pid in keys:
        cells = []
        for m in modes:
            values = list(speeds.get((m, pset, pid), {}).values())
            if not values:
                cells.append("-")
                continue
            ratio = summary[m].get("by_prompt", {}).get(f"{pset}/{pid}")
            cells.append(f"{statistics.median(values):.2f}" + (f" ({ratio:.2f}x)" if ratio and m != "baseline"
                                                                 else ""))
        lines.append(f"| {pset} | {pid} | " + " | ".join(cells) + " |")

    def row(label: str, value) -> str:
        return f"| {label[0]} | {label[1]} | " + " | ".join(value(summary[m]) for m in modes) + " |"

    lines.append(row(("**all**", "**geomean / baseline**"), lambda s: f"**{s.get('speedup', 0):.2f}x**"))
    references = [(key, label) for key, label in _reference_labels(summary)]
    for key, label in references:
        lines.append(row(("**all**", f"**geomean / {label}**"),
                         lambda s: f"**{s[key]['speedup']:.2f}x**" if key in s else "-"))
        lines.append(row(("all", f"worst prompt / {label}"),
                         lambda s: f"{s[key]['min_speedup']:.2f}x" if key in s else "-"))
    lines.append(row(("all", "worst prompt / baseline"), lambda s: f"{s.get('min_speedup', 0):.2f}x"))
    lines.append(row(("all", "spread of one repeat"), lambda s: f"±{s.get('spread', 0) / 2:.2f}"))
    for name in dict.fromkeys(pset for pset, _ in keys):
        lines.append(row((name, "geomean / baseline"), lambda s: f"{s.get('by_set', {}).get(name, 0):.2f}x"))
        for key, label in references:
            lines.append(row((name, f"geomean / {label}"), lambda s: f"{s[key]['by_set'].get(name, 0):.2f}x"
                             if key in s else "-"))
    if any("window_over_engine" in s for s in summary.values()):
        lines.append(row(("all", "window / engine"), lambda s: f"{s['window_over_engine']:.3f} "
                         f"(worst {s['window_over_engine_worst']:.3f})" if "window_over_engine" in s else "-"))
    if any("python_ms_per_step" in s for s in summary.values()):
        lines.append(row(("all", "Python ms per step"), lambda s: f"{s['python_ms_per_step']:.2f}"
                         if "python_ms_per_step" in s else "-"))
    if any("same_drafts" in s for s in summary.values()):
        lines.append(row(("all", "accepted per step, same drafts: SpecInfer / SpecTr"),
                         lambda s: f"{s['same_drafts']['specinfer']:.3f} / {s['same_drafts']['spectr']:.3f}"
                         if "same_drafts" in s else "-"))
    for m in modes:
        if "predicted_speedup" in summary[m]:
            lines += ["", f"{m}: predicted {summary[m]['predicted_speedup']:.2f}x by the planner, realised "
                          f"{summary[m]['speedup']:.2f}x ({summary[m]['realised_over_predicted'] * 100:.0f}% of the "
                          "prediction)"]
    best = next((s[f"over_{BEST}"] for s in summary.values() if f"over_{BEST}" in s), None)
    if best:
        per_set = ", ".join(f"{pset}: {config}" for pset, config in best["config_by_set"].items())
        lines += ["", f"llama-server's best configuration (highest geomean over llama-server plain): {best['config']} "
                      f"over all prompts; per set ({per_set})"]
    diverged = [r for r in runs if r.get("greedy_vs_baseline", "identical").split(" ")[0] not in ("identical", "")]
    if diverged:
        lines += ["", "Greedy outputs that differ from baseline (batched kernels at near-ties, see MODELS.md):"]
        lines += [f"- {r['mode']} on {r['prompt_id']} (repeat {r['repeat'] + 1}): {r['greedy_vs_baseline']}"
                  for r in diverged]
    return "\n".join(lines)
