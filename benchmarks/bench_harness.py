"""The harness's own speed: today's way and the fast way, side by side in one run.

    OPFORGE_TORCH_INDEX=pypi python benchmarks/bench_harness.py [--pairs 3] [--rows ROW ...]
        [--variant cpu] [--file matrix.yaml] [--wheel W] [--json results.json]

Each row times one piece of harness work done two ways ("old": what opforge did before,
"new": what it does now). The two are measured in pairs, alternating which goes first, and
the row's speed-up is the median over pairs of old time / new time, so load from other
processes on a shared machine hits both sides of a pair alike. "noise" is the median absolute
deviation of those ratios, as a share of the median. Each side of a pair returns what it
produced (the torch it installed, say) and the row fails if the two disagree: the fast way
must make the same thing.

Rows (see ROWS below):
  smoke-env-warm   fresh smoke environment with the variant's torch: virtualenv + pip vs uv,
                   uv's cache warm (any machine that made one environment before)
  smoke-env-cold   the same with an empty uv cache (a fresh machine)
  smoke-warm       the whole `opforge smoke --variant V --wheel W` (uv's cache and the kept
                   bytecode warm) vs only making a bare environment by hand: virtualenv,
                   pip install torch and the wheel (issue 38 asks >= 5x)
  bisect-env       one bisect probe environment (bisect's EnvCache) for a torch wheel: pip vs uv
  build-fresh-clone  `opforge build` of the variant in a fresh clone of this checkout's HEAD:
                   --no-compiler-cache vs sccache warm with another clone's objects (CI's
                   restored cache, or the tests session's build on the same machine)
  rebuild-touch-one  the same build again in a kept clone after touching its largest .cpp:
                   ninja compiles it (no cache) vs sccache serves it

Adding a row (a build, a CI run): write ``old(scratch) -> result`` and ``new(scratch) ->
result`` (each gets a fresh empty directory; return what a user would compare, or None) and
append a ``Row`` to ROWS; ``prepare`` runs once, untimed, before the first pair.

Exit status 1 when a row misses its target or the two ways disagree; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's opforge, as noxfile.py does

from opforge.errors import OpforgeError  # noqa: E402
from opforge.venv import Installer, find_uv  # noqa: E402


@dataclass
class Row:
    name: str
    what: str                                    # one line: what is timed
    old: Callable[[Path], object]                # today's way; gets a fresh scratch dir
    new: Callable[[Path], object]                # the fast way
    target: float | None = None                  # the speed-up asked for (old / new)
    prepare: Callable[[], None] | None = None    # untimed, once, before the first pair
    settle: Callable[[], None] | None = None     # untimed, after each side (work it left behind)
    times: dict[str, list[float]] = field(default_factory=lambda: {"old": [], "new": []})
    results: set = field(default_factory=set)


@dataclass(frozen=True)
class Context:
    """What the rows share: the torch to install and from where, a scratch root."""

    torch_spec: str
    index_args: tuple[str, ...]
    scratch: Path
    uv: str
    variant: str = "cpu"
    matrix_file: Path = ROOT / "matrix.yaml"
    wheel: Path | None = None     # the variant's wheel (smoke-warm); default: dist/<variant>'s


def _torch_in(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                          "print(m.version('torch'))"], capture_output=True, text=True)
    return out.stdout.strip() or "no torch"


def _smoke_env(tool: Installer, ctx: Context, scratch: Path, env: dict | None = None) -> str:
    """What `opforge smoke` does before the probe: a fresh env, the variant's torch in it."""
    python = tool.create(scratch / "env")
    tool.install(python, ctx.torch_spec, *ctx.index_args, env=env)
    return _torch_in(python)


def smoke_rows(ctx: Context) -> list[Row]:
    pip, uv = Installer(uv=None), Installer(uv=ctx.uv)

    def cold(scratch: Path) -> str:
        # an empty cache: every wheel is fetched (or copied from find-links) and unpacked
        env = {**os.environ, "UV_CACHE_DIR": str(scratch / "uv-cache")}
        return _smoke_env(uv, ctx, scratch, env=env)

    def wheel() -> Path:
        found = [ctx.wheel] if ctx.wheel else sorted(
            (ctx.matrix_file.parent / "dist" / ctx.variant).glob("*.whl"),
            key=lambda p: p.stat().st_mtime)
        if not found:
            raise OpforgeError(f"smoke-warm needs the {ctx.variant} wheel: opforge build "
                               f"--variant {ctx.variant}, or --wheel W")
        return found[-1]

    def bare(scratch: Path) -> str:
        # what a user does by hand, no check at all: a venv, the variant's torch, the wheel
        python = pip.create(scratch / "env")
        pip.install(python, ctx.torch_spec, *ctx.index_args)
        pip.install(python, str(wheel()), *ctx.index_args)
        return _torch_in(python)

    def smoke(scratch: Path) -> str:
        out = scratch / "smoke.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        env.pop("GITHUB_STEP_SUMMARY", None)
        done = subprocess.run([sys.executable, "-m", "opforge", "smoke", "--variant",
                               ctx.variant, "--wheel", str(wheel()), "--file",
                               str(ctx.matrix_file), "--json", str(out)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise OpforgeError(f"opforge smoke failed ({done.returncode}): "
                               f"{done.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())["environment"]["torch_version"]

    def removed() -> None:
        # smoke removes its environment behind itself: that disk work must not land in the
        # next measurement (the user's command does not wait for it, the next pair would)
        for _ in range(1200):
            if not list(Path(tempfile.gettempdir()).glob(".opforge-smoke-env-*.removing")):
                return
            time.sleep(0.05)

    return [
        Row("smoke-warm", f"opforge smoke --variant {ctx.variant} (warm) vs a bare virtualenv "
            f"+ pip install {ctx.torch_spec} and the wheel", old=bare, new=smoke, target=5.0,
            prepare=lambda: smoke(_fresh(ctx.scratch)), settle=removed),
        Row("smoke-env-warm", f"fresh env + {ctx.torch_spec}: virtualenv + pip vs uv, "
            "uv's cache warm",
            old=lambda s: _smoke_env(pip, ctx, s), new=lambda s: _smoke_env(uv, ctx, s),
            target=5.0, prepare=lambda: _smoke_env(uv, ctx, _fresh(ctx.scratch))),
        Row("smoke-env-cold", f"fresh env + {ctx.torch_spec}: virtualenv + pip vs uv, "
            "uv's cache empty",
            old=lambda s: _smoke_env(pip, ctx, s), new=cold),
    ]


def bisect_rows(ctx: Context) -> list[Row]:
    from datetime import date

    from opforge.bisect.envs import EnvCache
    from opforge.bisect.index import Nightly

    wheels = ctx.scratch / "torch-wheel"

    def fetch_wheel() -> None:
        # one torch wheel stands in for a nightly: bisect installs it by URL, as a nightly
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
               ctx.torch_spec, *ctx.index_args]
        subprocess.run(cmd, check=True)

    def probe_env(tool_name: str, scratch: Path) -> str:
        wheel = next(wheels.glob("torch-*.whl"))
        nightly = Nightly(date(2000, 1, 1), wheel.name.split("-")[1], wheel.name,
                          wheel.as_uri())
        os.environ["OPFORGE_INSTALLER"] = tool_name
        try:
            env = EnvCache(scratch / "cache", sys.executable, list(ctx.index_args)).ensure(nightly)
        finally:
            del os.environ["OPFORGE_INSTALLER"]
        return env.torch_version

    return [Row("bisect-env", "one bisect probe environment (EnvCache.ensure, torch wheel by "
                "URL): venv + host pip vs uv",
                old=lambda s: probe_env("pip", s), new=lambda s: probe_env("uv", s),
                prepare=fetch_wheel)]


def build_rows(ctx: Context) -> list[Row]:
    """Compiles: sccache (warm with another clone's objects) vs compiling every file."""
    source = Path(subprocess.run(["git", "-C", str(ctx.matrix_file.parent), "rev-parse",
                                  "--show-toplevel"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    matrix_rel = ctx.matrix_file.relative_to(source)
    # $SCCACHE_DIR (a machine's warm cache: prepare then only checks it), else this run's own
    cache = {"SCCACHE_DIR": os.environ.get("SCCACHE_DIR") or str(ctx.scratch / "sccache")}
    kept = ctx.scratch / "kept"

    def build(checkout: Path, *args: str) -> str:
        out = checkout / "dist" / ctx.variant
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **cache}
        env.pop("GITHUB_STEP_SUMMARY", None)
        subprocess.run([sys.executable, "-m", "opforge", "build", "--variant", ctx.variant,
                        "--file", str(checkout / matrix_rel), "--out", str(out), *args],
                       cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
        (wheel,) = out.glob("*.whl")
        return wheel.name  # objects from another clone carry its paths in __FILE__ only

    def fresh_clone(scratch: Path, *args: str) -> str:
        checkout = scratch / "clone"  # what CI starts from: HEAD, no build/, no .nox/
        subprocess.run(["git", "clone", "-q", str(source), str(checkout)], check=True)
        return build(checkout, *args)

    def touched(*args: str) -> str:
        checkout = kept / "clone"
        if not checkout.exists():
            fresh_clone(kept)  # compiled once: ninja's objects and the cache are warm
        # the largest tracked C++ source: the compile a maintainer waits longest for
        tracked = subprocess.run(["git", "-C", str(checkout), "ls-files", "*.cpp", "*.cc"],
                                 capture_output=True, text=True, check=True).stdout.split()
        kernel = max((checkout / p for p in tracked), key=lambda p: p.stat().st_size)
        kernel.touch()
        return build(checkout, *args)

    return [
        Row("build-fresh-clone", f"opforge build --variant {ctx.variant}, fresh clone: "
            "no cache vs warm cache", old=lambda s: fresh_clone(s, "--no-compiler-cache"),
            new=fresh_clone, target=5.0, prepare=lambda: fresh_clone(_fresh(ctx.scratch))),
        Row("rebuild-touch-one", "the same build after touching its largest .cpp",
            old=lambda s: touched("--no-compiler-cache"), new=lambda s: touched(),
            prepare=lambda: touched()),
    ]


ROW_FACTORIES = (smoke_rows, bisect_rows, build_rows)


def _fresh(root: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=root))


def measure(row: Row, pairs: int, scratch_root: Path, log) -> None:
    if row.prepare:
        row.prepare()
    for i in range(pairs):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for side in order:
            scratch = _fresh(scratch_root)
            t0 = time.perf_counter()
            result = (row.old if side == "old" else row.new)(scratch)
            row.times[side].append(time.perf_counter() - t0)
            if row.settle:
                row.settle()
            row.results.add(result)
            shutil.rmtree(scratch, ignore_errors=True)  # torch envs are large
        log(f"bench_harness: {row.name} pair {i + 1}/{pairs}: old {row.times['old'][-1]:.1f} s, "
            f"new {row.times['new'][-1]:.1f} s")


def summarize(row: Row) -> dict:
    ratios = [o / n for o, n in zip(row.times["old"], row.times["new"])]
    speedup = statistics.median(ratios)
    noise = statistics.median(abs(r - speedup) for r in ratios) / speedup
    agree = len(row.results) == 1
    ok = agree and (row.target is None or speedup >= row.target)
    return {"row": row.name, "what": row.what, "old_s": statistics.median(row.times["old"]),
            "new_s": statistics.median(row.times["new"]), "speedup": speedup, "noise": noise,
            "pairs": len(ratios), "target": row.target, "results": sorted(map(str, row.results)),
            "agree": agree, "ok": ok, "times": row.times}


def print_table(summaries: list[dict]) -> None:
    """A plain table (the harness runs before opforge's dependencies are installed)."""
    header = ("row", "old s", "new s", "speed-up", "noise", "pairs", "target", "verdict",
              "same result")
    rows = [(s["row"], f"{s['old_s']:.2f}", f"{s['new_s']:.2f}", f"{s['speedup']:.1f}x",
             f"±{s['noise'] * 100:.0f}%", str(s["pairs"]),
             f">={s['target']:.0f}x" if s["target"] else "-", "ok" if s["ok"] else "FAIL",
             ", ".join(s["results"]) if s["agree"] else "NO: " + " vs ".join(s["results"]))
            for s in summaries]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    print("opforge harness: old vs new, speed-up = median of per-pair old/new ratios")
    for r in (header, *rows):
        print("  ".join(c.ljust(w) if i in (0, 8) else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    for s in summaries:
        print(f"  {s['row']}: {s['what']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="old/new pairs per row (>= 1)")
    parser.add_argument("--rows", nargs="+", metavar="ROW", help="only these rows")
    parser.add_argument("--file", type=Path, default=ROOT / "matrix.yaml", help="matrix.yaml")
    parser.add_argument("--variant", default="cpu", help="whose torch the environments get")
    parser.add_argument("--wheel", type=Path, help="the variant's wheel for smoke-warm "
                        "(default: the newest in dist/<variant>)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from opforge.matrix import load_matrix
    from opforge.torchsource import pip_index_args, resolve_index

    uv = find_uv()
    try:
        if uv is None:
            raise OpforgeError("uv is not installed (pip install uv): there is no new side")
        matrix = load_matrix(args.file)
        variant = matrix.variant(args.variant)
        spec = matrix.torch_spec(variant)
        index = tuple(pip_index_args(resolve_index(matrix.torch_index(variant))))
    except OpforgeError as exc:
        print(f"bench_harness: error: {exc}", file=sys.stderr)
        return 2
    scratch_root = Path(tempfile.mkdtemp(prefix="opforge-bench-harness-"))
    try:
        ctx = Context(spec, index, scratch_root, uv, variant.name, args.file.resolve(),
                      args.wheel.resolve() if args.wheel else None)
        rows = [row for factory in ROW_FACTORIES for row in factory(ctx)]
        known = [row.name for row in rows]
        unknown = sorted(set(args.rows or ()) - set(known))
        if unknown:
            print(f"bench_harness: error: unknown row(s) {', '.join(unknown)}; rows: "
                  f"{', '.join(known)}", file=sys.stderr)
            return 2
        rows = [row for row in rows if not args.rows or row.name in args.rows]
        summaries = []
        for row in rows:
            try:
                measure(row, args.pairs, scratch_root, lambda m: print(m, file=sys.stderr))
            except OpforgeError as exc:
                print(f"bench_harness: {row.name}: error: {exc}", file=sys.stderr)
                return 1
            summaries.append(summarize(row))
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    print_table(summaries)
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
    return 0 if all(s["ok"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
