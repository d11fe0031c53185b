"""Regenerate the results tables the README and docs quote: each figure runs its commands (train.py multiruns,
bench/ scripts), reads their outputs, writes docs/results/<name>.md and splices its table into the page that
holds its block (README.md or a docs/*.md page).

    python -m scripts.readme_figures --list                    # the figures, their commands and durations
    python -m scripts.readme_figures --only quickstart         # one figure (or --only a,b); none: all (hours)
    python -m scripts.readme_figures --only quickstart --smoke # shrunk steps and seeds, into a temp dir (or
                                                               # --out DIR): docs/results and the pages untouched
    python -m scripts.readme_figures --readme                  # only re-splice the pages from docs/results/

docs/results/<name>.md starts with a header: the command (this script's invocation) and the commands it
ran, the git commit (and whether tracked files had uncommitted changes), the date (UTC), the machine (CPU
model, cores, torch threads, OMP_NUM_THREADS) and the 1-minute load average at the start and the end (a
busy machine shows), and a status line; then the table(s) the page shows; then `## Notes`, for the
file only. A file converted from a table measured before this script existed says so in its status line
and names the command that measured it: it is not regenerated until this script has run it.

The rule, checked by tests/test_readme_figures.py: every Markdown table in README.md (and in each docs page
that holds a figure block) is either a
figure block, `<!-- figure:NAME -->` … `<!-- /figure:NAME -->` for a registered NAME, whose first line is
a caption naming the commit and the command, or a reference table (no measured numbers: config groups,
the metrics glossary) with `<!-- not-a-figure: why -->` on the line right above it. A measured table that
no command produces has no place in those pages.

Figures are registered in scripts/figures/training.py (train.py multiruns) and scripts/figures/bench.py
(bench/ scripts). Each run's outputs stay in multirun/figures/<name>-<UTC time>/ (git-ignored).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.figures import training, bench, economics  # noqa: F401,I001  (they register their figures, in this order)
from scripts.figures import async_rounds  # noqa: F401,E402  (registers the overlap figure, issue 32)
from scripts.figures.provenance import ROOT, Provenance, header
from scripts.figures.readme import NOTES, RESULTS, block_body, page_of, splice, splice_file
from scripts.figures.registry import FIGURES, PENDING, Figure


def shown(argv: list[str]) -> str:
    return shlex.join(argv)


def run_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # bash scripts' `python`
    for key, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
                       "TOKENIZERS_PARALLELISM": "false"}.items():
        env.setdefault(key, value)
    return env


def finished_dir(argv: list[str]) -> Path | None:
    """The `hydra.run.dir` of a single-run command whose summary.json exists (it is written at a stage's end),
    so a figure rerun with the same --out resumes; a dir a stopped run left without one is removed."""
    found = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if not found or "-m" in argv:
        return None
    run_dir = Path(found[0]) if Path(found[0]).is_absolute() else ROOT / found[0]
    if (run_dir / "summary.json").is_file():
        return run_dir
    if run_dir.is_dir():
        shutil.rmtree(run_dir)
    return None


def run_commands(commands: list[list[str]], log: Path) -> None:
    """Each command in the repository root, output appended to `log`; stop at the first that fails. A run
    whose dir already holds its summary.json (an earlier, stopped measurement into the same --out) is kept."""
    with log.open("a") as f:
        for argv in commands:
            if (done := finished_dir(argv)) is not None:
                print(f"kept (finished earlier): {done}", flush=True)
                f.write(f"kept (finished earlier): {shown(argv)}\n")
                continue
            print(f"$ {shown(argv)}", flush=True)
            f.write(f"$ {shown(argv)}\n")
            f.flush()
            exe = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
            rc = subprocess.run(exe, cwd=ROOT, env=run_env(), stdout=f, stderr=subprocess.STDOUT).returncode
            if rc:
                tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
                raise SystemExit(f"{tail}\nfailed (rc {rc}): {shown(argv)}\nlog: {log}")


def results_text(figure: Figure, prov: Provenance, out: Path, smoke: bool) -> str:
    rendered = figure.render(out if out.is_absolute() else ROOT / out, smoke)
    text = header(figure.title, prov.fields()) + "\n" + rendered.table.strip() + "\n"
    return text + (f"\n{NOTES}\n\n{rendered.notes.strip()}\n" if rendered.notes else "")


def make(figure: Figure, out: Path, smoke: bool, invocation: str) -> str:
    """Run the figure's commands into `out`, render, return docs/results/<name>.md's text."""
    (out if out.is_absolute() else ROOT / out).mkdir(parents=True, exist_ok=True)
    commands = figure.commands(out, smoke)
    status = ("SMOKE RUN (steps and seeds shrunk): plumbing only, the figures mean nothing" if smoke
              else "regenerated by this command")
    prov = Provenance(command=invocation, ran=[shown(c) for c in commands], status=status)
    started = time.perf_counter()
    run_commands(commands, (out if out.is_absolute() else ROOT / out) / f"{figure.name}.log")
    prov.finish()
    print(f"{figure.name}: commands took {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    return results_text(figure, prov, out, smoke)


def write(name: str, text: str, results: Path, copy_to: Path | None = None) -> None:
    """docs/results/<name>.md (smoke: under --out), and the figure's block in the page that holds it
    (README.md or a docs page; smoke: in a copy of that page under `copy_to`, the page itself untouched)."""
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.md").write_text(text)
    page = page_of(name)
    target = page if copy_to is None or page is None else copy_to / page.name
    if page is not None:
        if not target.exists():
            target.write_text(page.read_text())
        target.write_text(splice(target.read_text(), name, block_body(name, text, page), target.name))
    print(f"wrote {results / f'{name}.md'}" + (f" and its block in {target}" if page is not None else ""))


def selected(only: str | None) -> list[Figure]:
    known = FIGURES | PENDING  # a pending figure runs only when named
    names = [n.strip() for n in only.split(",")] if only else list(FIGURES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"--only: no figure named {', '.join(unknown)}; registered: {', '.join(known)}")
    return [known[n] for n in names]


def list_figures() -> None:
    for f in [*FIGURES.values(), *PENDING.values()]:
        print(f"{f.name}: {f.title} ({f.duration})" + (" [pending: not yet measured]" if f.name in PENDING else ""))
        for argv in f.commands(Path(f"multirun/figures/{f.name}-<UTC time>"), False):
            print(f"    {shown(argv)}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--only", help="comma-separated figure names (default: every figure)")
    p.add_argument("--list", action="store_true", help="list the figures and their commands")
    p.add_argument("--smoke", action="store_true", help="shrunk steps and seeds, written under --out (a temp dir)")
    p.add_argument("--out", type=Path, help="where the runs go (smoke: also the results and a copy of the page)")
    p.add_argument("--readme", action="store_true", help="only splice docs/results/*.md into the pages holding them")
    args = p.parse_args(argv)
    if args.list:
        return list_figures()
    if args.readme:
        spliced = {f.name: splice_file(f.name) for f in selected(args.only)}
        return print(f"spliced {len(spliced)} figure(s) into {', '.join(sorted({p.name for p in spliced.values()}))}")
    invocation = shown(["python", "-m", "scripts.readme_figures", *(argv if argv is not None else sys.argv[1:])])
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for f in selected(args.only):
        if args.smoke:
            out = (args.out or Path(tempfile.mkdtemp(prefix="readme-figures-"))).resolve() / f.name
            out.parent.mkdir(parents=True, exist_ok=True)
            write(f.name, make(f, out, True, invocation), out.parent / "results", copy_to=out.parent)
        else:
            out = args.out / f.name if args.out else Path("multirun/figures") / f"{f.name}-{stamp}"
            write(f.name, make(f, out, False, invocation), RESULTS)


if __name__ == "__main__":
    main()
