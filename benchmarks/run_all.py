"""Run every figure, then print and store the table of ratios partitioner / jax.jit.

Why subprocesses: each figure gets a fresh interpreter, so no figure inherits
another's caches, heap or compiled executables, and one failing figure does not
stop the rest. ``nox -s bench`` runs this script; ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIGURES = (
    "dispatch",
    "compile",
    "step",
    "loop",
    "memory",
    "lowering",
    "callbacks",
    "multiprocess",
    "colocated",
    "pmap",
    "auto",
    "pipeline",
    "plan",
    "startup",
)


def run_figure(name: str, flags: list[str]) -> tuple[int, float]:
    """Run ``bench_<name>.py`` with its output streamed; returns (exit code, seconds)."""
    print(f"\n##### {name} #####", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call([sys.executable, str(HERE / f"bench_{name}.py"), *flags], cwd=HERE)
    return rc, time.perf_counter() - t0


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}"


def load_rows(names: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every row of every figure's JSON, tagged with its figure; plus one environment."""
    rows: list[dict[str, Any]] = []
    env: dict[str, Any] = {}
    for name in names:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        env = env or data["env"]
        for row in data["rows"]:
            rows.append({"figure": name, "quick": data["quick"], **row})
    return rows, env


def _ratio(ratio: float | None, noise: float) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3f} +- {noise:.3f}" if noise else f"{ratio:.3f}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The summary as Markdown table lines."""
    lines = [
        "| figure | name | partitioner | jax.jit | unit | ratio (wall) | ratio (cpu) | target | status |",
        "|---|---|---:|---:|---|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['figure']} | {r['name']} | {_fmt(r['partitioner'])} | {_fmt(r['jax_jit'])} | {r['unit']} "
            f"| {_ratio(r['ratio'], r['noise'])} | {_ratio(r.get('cpu_ratio'), r.get('cpu_noise', 0.0))} "
            f"| {r['target']} | {r['status']} |"
        )
    return lines


def write_summary(
    rows: list[dict[str, Any]], env: dict[str, Any], timings: dict[str, Any], quick: bool
) -> None:
    summary = {"quick": quick, "env": env, "timings_s": timings, "rows": rows}
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    missed = [r for r in rows if r["status"] in ("MISSED", "noise")]
    md = [
        "# Benchmarks: partitioner vs jax.jit",
        "",
        f"Measured {env.get('time', '?')} on {env.get('cpus', '?')} CPU cores, {env.get('devices', '?')} "
        f"virtual {env.get('platform', '?')} devices, jax {env.get('jax', '?')}"
        f", load average (1/5/15 min) {', '.join(f'{x:.1f}' for x in env.get('loadavg_1_5_15', []))}"
        + (" (quick smoke run: not a measurement)" if quick else "")
        + ".",
        "Ratio = partitioner median / jax.jit median (wall clock); +- is half the IQR of the",
        "per-round paired ratios. Ratio (cpu) is the same from this process's CPU time, which",
        "other tenants of a shared machine do not inflate. Status (from the wall ratio): ok;",
        "noise = over the target by less than the measured noise; MISSED.",
        "",
        *table(rows),
        "",
        "Plots: "
        + ", ".join(f"[{n}]({n}.png)" for n in FIGURES if (RESULTS / f"{n}.png").exists()),
        "",
        f"Wall time: {timings.get('total', 0):.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items() if k != "total")
        + ").",
    ]
    if missed:
        md += [
            "",
            "Missed (profiles in the figure's JSON): "
            + ", ".join(f"{r['figure']}/{r['name']}" for r in missed),
        ]
    (RESULTS / "summary.md").write_text("\n".join(md) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run of every figure (under a minute)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile the partitioner side of every figure"
    )
    parser.add_argument(
        "--only", default=",".join(FIGURES), help=f"comma-separated subset of {','.join(FIGURES)}"
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s) {sorted(unknown)}; choose from {list(FIGURES)}")
    flags = (["--quick"] if args.quick else []) + (["--profile"] if args.profile else [])
    RESULTS.mkdir(exist_ok=True)
    timings: dict[str, float] = {}
    failed = []
    t0 = time.perf_counter()
    for name in names:
        (RESULTS / f"{name}.json").unlink(missing_ok=True)  # never report a stale figure
        rc, seconds = run_figure(name, flags)
        timings[name] = seconds
        if rc:
            failed.append(name)
    timings["total"] = time.perf_counter() - t0

    rows, env = load_rows(names)
    write_summary(rows, env, timings, args.quick)
    print("\n##### summary (partitioner / jax.jit) #####")
    print("\n".join(table(rows)))
    print(
        f"\nwall time {timings['total']:.0f} s; wrote {RESULTS / 'summary.md'} and {RESULTS / 'summary.json'}"
    )
    if failed:
        print(f"FAILED figures: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
