"""The policy file a calibration writes: the template with what was fitted, each intent
commented with the data behind its numbers, under a version of its own so that records stamped
under another calibration are never served by these thresholds."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from proxy.tools.calibrate import Calibration, VerifyCalibration

_CALIBRATED = "+cal."  # joins a template's version to the digest of what a calibration chose
VERIFY_SETTINGS = ("verify_accept", "verify_previous")  # the policy keys verifier levels go to


def calibrated_version(template: str, chosen: Mapping[str, Any]) -> str:
    """A version of its own for every calibration that chose other numbers: records are stamped
    with the policy version, so thresholds from another calibration never serve them. Recalibrating
    a calibrated file replaces its digest instead of stacking another."""
    stem = template.split(_CALIBRATED, 1)[0]
    digest = hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:10]
    return f"{stem}{_CALIBRATED}{digest}"


def write_policy(
    source: Path,
    out: Path,
    results: Mapping[str, Calibration],
    *,
    traces: Sequence[str],
    target: float,
    embedding_model: str | None = None,
    verified: Mapping[str, VerifyCalibration] | None = None,
    previous: Mapping[str, VerifyCalibration] | None = None,
    verify_target: float | None = None,
) -> str:
    """The input policy with calibrated thresholds (and verifier levels, for the intents that
    verify), each intent commented with its data, stamped with the embedding model whose scores
    they were measured on, under a new version. Returns that version."""
    data: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    intents: dict[str, Any] = {}
    comments: dict[str, list[str]] = {}
    for name, body in (data.get("intents") or {}).items():
        cached = (body or {}).get("cache", data["defaults"].get("cache", True)) is not False
        levels = [v for v in ((verified or {}).get(name), (previous or {}).get(name)) if v is not None and v.fitted]
        intents[name], comments[name] = _calibrated_intent(
            name, dict(body or {}), results.get(name) if cached else None, levels if cached else [], cached=cached
        )
    model = embedding_model or data.get("embedding_model")
    rest = {k: v for k, v in data.items() if k not in ("version", "embedding_model", "intents")}
    if isinstance(rest.get("defaults"), dict):
        # a template's verifier levels only ask shadow replay to verify: what serves is what was fitted
        rest["defaults"] = {k: v for k, v in rest["defaults"].items() if k not in VERIFY_SETTINGS}
    content = {**({"embedding_model": model} if model else {}), **rest, "intents": intents}
    version = calibrated_version(str(data.get("version", "")), content)
    verify_flag = "" if verify_target in (None, target) else f" --verify-target {verify_target:g}"
    header = [
        f"# Calibrated by `smartcache calibrate --target-false-hit {target:g}{verify_flag}` on:",
        *[f"#   {t}" for t in traces],
        "# Per intent: samples = requests whose best candidate passed the nets. An intent whose",
        "# data cannot show the target keeps the template's thresholds (said at the intent).",
        "",
    ]
    top = {"version": version, **{k: v for k, v in content.items() if k != "intents"}}
    blocks = []
    for name, body in intents.items():
        dumped = yaml.safe_dump({name: body}, allow_unicode=True, sort_keys=False, width=110)
        blocks.append("\n".join(comments[name] + ["  " + ln if ln else ln for ln in dumped.splitlines()]))
    text = "\n".join(header) + yaml.safe_dump(top, allow_unicode=True, sort_keys=False, width=110)
    out.write_text(text + "intents:\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
    return version


def _calibrated_intent(
    name: str, body: dict[str, Any], cal: Calibration | None, levels: Sequence[VerifyCalibration], *, cached: bool
) -> tuple[dict[str, Any], list[str]]:
    """An intent's body with what calibration chose, and the comment lines that say on what data.
    A verifier level calibration did not fit is dropped: the template's number was never measured."""
    lines = []
    candidate_floor = body.get("candidate")
    for setting in VERIFY_SETTINGS:
        body.pop(setting, None)
    if cal is not None and not cal.fitted:
        lines.append(f"  # {name}: {cal.samples} samples; thresholds left as they were")
        lines.append(f"  # {cal.note}")
    elif cal is not None:
        body["accept"], body["candidate"] = cal.accept, cal.candidate
        lines.append(
            f"  # {name}: {cal.samples} samples; at accept {cal.accept}: {cal.hits} hits, "
            f"{cal.false_hits} false, FHR upper bound {cal.fhr_upper:.4f}, recall {cal.recall:.3f}"
        )
        lines.append(f"  # {cal.note}")
    elif cached:
        lines.append(f"  # {name}: no data in these traces; thresholds left as they were")
    if any(v.setting == "verify_accept" for v in levels):
        # the verifier decides from the template's candidate floor up: a floor fitted for the accept
        # zone would hide from it the paraphrases that score low by cosine
        template_floor = candidate_floor
        if template_floor is None:
            body.pop("candidate", None)
        else:
            body["candidate"] = template_floor
    for v in levels:
        body[v.setting] = v.level
        lines.append(
            f"  # {name}: {v.samples} verified; at {v.setting} {v.level}: {v.hits} "
            f"hits, {v.false_hits} false, FHR upper bound {v.fhr_upper:.4f}; {v.note}"
        )
    return body, lines
