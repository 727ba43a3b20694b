"""What a finished ``train.py`` run of ``.gpu/run.sh``'s whole-run rows (gpu_run_rows.py) says: its figures from
metrics.json, its exported weights (``model/`` and ``hf/``) compared bit for bit with another run's, and the one line
each row prints as it ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def summarise(run: Path) -> dict[str, Any]:
    """A finished run's figures from its metrics.json: val before/after, the export checks, the memory plan's estimate
    beside the measured peak (GiB), the wall time by phase and the training rate."""
    metrics = json.loads((run / "metrics.json").read_text())
    memory, exports = metrics.get("memory") or {}, metrics.get("exports") or {}
    min_cosine = exports.get("min_cosine") or {}
    return {"val_before": metrics["val_before"].get("val/ndcg@10"), "val": metrics["val"].get("val/ndcg@10"),
            "recall10": metrics["val"].get("val/recall@10"), "global_step": metrics.get("global_step"),
            "exports_min_cosine": min(min_cosine.values()) if min_cosine else None, "exports": sorted(min_cosine),
            "round_trip_max_abs_diff": exports.get("state_dict_round_trip_max_abs_diff"),
            "cpu_vs_gpu_max_abs_diff": exports.get("cpu_vs_gpu_max_abs_diff"),
            "estimated_gib": memory.get("estimated_peak"), "measured_gib": memory.get("measured_peak_allocated"),
            "peak_rss_mb": max((metrics.get("peak_rss_mb") or {}).values(), default=None),
            "timing": metrics.get("timing") or {}, "samples_per_s": (metrics.get("train") or {}).get(
                "train/samples_per_s"), "restarts": len(metrics.get("restarts") or [])}


def weights(run: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    found: dict[str, torch.Tensor] = {}
    for folder in ("model", "hf"):
        for path in sorted((run / folder).rglob("*.safetensors")):
            found.update({f"{path.relative_to(run)}:{key}": value for key, value in load_file(path).items()})
    return found


def compare(run: Path, reference: Path) -> dict[str, Any]:
    """Whether every exported tensor of ``run`` equals ``reference``'s bit for bit, and the largest difference."""
    import torch

    ours, theirs = weights(run), weights(reference)
    if not ours or ours.keys() != theirs.keys():
        return {"identical": False, "max_abs_diff": None, "tensors": len(ours), "note": "different tensors"}
    diff = max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in ours)
    return {"identical": all(torch.equal(ours[k], theirs[k]) for k in ours), "max_abs_diff": diff,
            "tensors": len(ours)}


def memory_text(result: dict[str, Any]) -> str:
    estimated, measured = result.get("estimated_gib"), result.get("measured_gib")
    text = f"memory estimated {estimated:.3f} GiB" if estimated is not None else "memory estimate -"
    if measured is not None:
        ratio = f", {measured / estimated:.2f}x the estimate" if estimated else ""
        return f"{text}, max_memory_allocated {measured:.3f} GiB{ratio}"
    rss = f", peak RSS {result['peak_rss_mb']:,.0f} MB" if result.get("peak_rss_mb") else ""
    return f"{text} (no CUDA: nothing measured against it){rss}"


def row_line(result: dict[str, Any]) -> str:
    """One row as it ends."""
    name = result["row"]
    if "error" in result:
        return f"{name}: FAILED after {result.get('wall_s', 0):.0f} s: {result['error']}"
    parts = [f"{name}: ok in {result['wall_s']:.0f} s (training {result['timing'].get('training', 0):.1f} s, "
             f"{result['samples_per_s'] or 0:.0f} samples/s, {result['global_step']} steps)",
             f"val/ndcg@10 {result['val_before']:.4f} -> {result['val']:.4f} (recall@10 {result['recall10']:.4f})",
             f"exports {'+'.join(result['exports'])} min cosine {result['exports_min_cosine']:.7f}, round trip "
             f"{result['round_trip_max_abs_diff']:.1e}, CPU vs GPU " + (
                 f"{result['cpu_vs_gpu_max_abs_diff']:.1e}" if result["cpu_vs_gpu_max_abs_diff"] is not None
                 else "- (no GPU)"), memory_text(result)]
    if "resume" in result:
        parts.append(resume_text(result["resume"]))
    if "vs_whole" in result:
        vs = result["vs_whole"]
        diff = "-" if vs["max_abs_diff"] is None else f"{vs['max_abs_diff']:.1e}"
        parts.append(f"beside whole: val/ndcg@10 {vs['val_delta']:+.4f}, weights "
                     f"{'identical' if vs['identical'] else f'max abs diff {diff}'}")
    return "; ".join(parts)


def resume_text(resume: dict[str, Any]) -> str:
    same = resume["vs_reference"]
    verdict = "IDENTICAL weights" if same["identical"] else "DIFFERENT weights"
    diff = "-" if same["max_abs_diff"] is None else f"{same['max_abs_diff']:.1e}"
    text = (f"killed -9 at step {resume['killed_at_step']}/{resume['steps']}, resumed from step "
            f"{resume['resumed_from_step']}: {verdict} to the uninterrupted run (max abs diff {diff}, "
            f"{same['tensors']} tensors; trainer.deterministic={resume['deterministic']})")
    if resume.get("whole_vs_reference"):
        whole = resume["whole_vs_reference"]
        whole_diff = "-" if whole["max_abs_diff"] is None else f"{whole['max_abs_diff']:.1e}"
        text += (f"; the whole row (deterministic=false) against it: "
                 f"{'identical' if whole['identical'] else f'max abs diff {whole_diff}'}")
    if resume.get("training_s_deterministic") and resume.get("training_s_whole"):
        text += (f"; training {resume['training_s_deterministic']:.1f} s deterministic vs "
                 f"{resume['training_s_whole']:.1f} s not")
    return text
