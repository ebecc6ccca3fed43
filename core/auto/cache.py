"""Where plans live: one JSON file per plan key in the ``plans`` folder of SpecLens's user cache.

A file that cannot be read or holds an impossible plan (a zero latency, a parent out of range, another version) is
logged and measured again; it never stops ``speclens plan`` or Auto.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from core import assembly
from core.auto.plan import Plan

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where plans are cached: the ``plans`` folder of SpecLens's user cache."""
    return assembly.cache_dir() / "plans"


def plan_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"plan-{digest}.json"


def save_plan(plan: Plan) -> Path | None:
    """Write the plan (atomically); a folder that cannot be written is logged, the plan is still used."""
    path = plan_path(plan.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan.to_json(), indent=1))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not save the plan to %s: %s", path, exc)
        return None
    return path


def load_plan(key: dict) -> Plan | None:
    """The cached plan for ``key``, or None when there is none or it is unusable (it is then measured again)."""
    path = plan_path(key)
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        plan = Plan.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("the cached plan %s is unusable (%s): measuring again", path, exc)
        return None
    return plan if plan.key == key else None
