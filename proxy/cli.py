"""The command line: serve, demo, stats, models, check-policy, and the offline replay, calibrate and warm."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from proxy.observability.log import configure_logging
from proxy.settings import Settings, SettingsError, load_settings, unknown_environment
from proxy.upstream.engine import EngineError  # the module, not the wheel: that one loads only to start

if TYPE_CHECKING:
    from rich.console import Console


# Into a pipe or a file rich would assume 80 columns and cut cells ("int…"); tables are never
# padded to the width, so a wide one costs nothing and keeps every cell whole.
PIPE_WIDTH = 1000


def table_console() -> Console:
    """A rich Console for tables: the terminal's width on a terminal, else PIPE_WIDTH."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream",
        help="OpenAI-compatible base URL, e.g. http://vllm:8000/v1 (default: start the embedded llama.cpp engine)",
    )
    p.add_argument(
        "--flavour",
        dest="upstream_flavour",
        choices=["vllm", "sglang", "llamacpp", "openai", "generic"],
        help="the upstream's engine, whose prefix-cache and routing hints are sent (default: generic, no hints)",
    )
    p.add_argument("--config", type=Path, help="YAML settings file")
    p.add_argument("--policy", type=Path, help="risk policy file (default: the one shipped for the embedding model)")
    p.add_argument("--host", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: 8080; 0: any free port)")
    _dir_args(p)
    p.add_argument(
        "--embedding-model",
        dest="embedding_model",
        help="offline pack name, fastembed:NAME, or a model directory (default: use-multilingual)",
    )
    p.add_argument(
        "--ready-after",
        dest="ready_after",
        type=float,
        help="feedback window in seconds before an answer becomes reusable (0 = at once)",
    )
    token = p.add_mutually_exclusive_group()
    token.add_argument(
        "--admin-token",
        dest="admin_token",
        help="bearer token of the admin API (/admin/*; default: none, the API is off). A flag shows "
        "in the process list: prefer --admin-token-file or SMARTCACHE_ADMIN_TOKEN",
    )
    token.add_argument(
        "--admin-token-file",
        dest="admin_token_file",
        type=Path,
        help="read the admin token from this file (a mounted secret), its line end aside",
    )
    p.add_argument(
        "--debug-headers",
        dest="debug_headers",
        action=argparse.BooleanOptionalAction,
        help="let a client ask for the decision's scores, intent, tags and timings with "
        "x-smartcache-debug: 1 (default: off, or SMARTCACHE_DEBUG_HEADERS)",
    )


def settings_from(args: argparse.Namespace) -> Settings:
    names = (
        "upstream",
        "upstream_flavour",
        "policy",
        "host",
        "port",
        "data_dir",
        "model_home",
        "embedding_model",
        "ready_after",
        "admin_token",
        "debug_headers",
    )
    overrides = {n: getattr(args, n, None) for n in names}
    if (token_file := getattr(args, "admin_token_file", None)) is not None:
        overrides["admin_token"] = read_secret(token_file, "admin_token_file")
    return load_settings(config_file=getattr(args, "config", None), overrides=overrides)


def read_secret(path: Path, key: str) -> str:
    """A secret kept in a file (a Docker or Kubernetes secret), without the line end an editor or
    ``echo`` leaves: a file that holds none fails at start, never as every admin call refused."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError("flags", key, f"cannot read {path}: {exc}") from exc
    if not secret:
        raise SettingsError("flags", key, f"{path} is empty")
    return secret


async def _serve(settings: Settings) -> None:
    from proxy.http.app import create_app
    from proxy.http.listener import raise_descriptor_limit, serving

    raise_descriptor_limit()
    app = create_app(settings)
    async with serving(app, settings.host, settings.port, max_connections=settings.max_connections):
        await _until_stopped(app, settings)


async def _until_stopped(app: web.Application, settings: Settings) -> None:
    """Serve until SIGINT or SIGTERM; SIGHUP reloads the policy."""
    from proxy.http.admin import reload_policy

    print(
        f"SmartCache listening on http://{settings.host}:{settings.port}/v1 -> {app[_upstream_key()]}; "
        f"feedback window {settings.ready_after:g} s: a new answer is served from the cache only after it "
        "(--ready-after, SMARTCACHE_READY_AFTER)",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    reloads: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def on_hup() -> None:
        async def go() -> None:
            from proxy.core.policy import PolicyError

            try:
                print(f"policy reloaded: {await reload_policy(app)}", file=sys.stderr, flush=True)
            except PolicyError as exc:
                print(f"policy NOT reloaded, the running one stays: {exc}", file=sys.stderr, flush=True)

        task = loop.create_task(go())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    await stop.wait()


def _upstream_key() -> Any:
    from proxy.http.app import UPSTREAM_URL

    return UPSTREAM_URL


def warn_unknown_environment(environ: Mapping[str, str]) -> None:
    """Settings ignore ``SMARTCACHE_*`` variables they do not know (other tools share the
    prefix), so a misspelt one is said here, at start, with the setting it was probably meant as."""
    log = structlog.get_logger("smartcache")
    for variable, closest in unknown_environment(environ):
        log.warning("settings.unknown_environment", variable=variable, did_you_mean=closest)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    configure_logging(settings.log_level, libraries=settings.log_libraries)
    warn_unknown_environment(os.environ)
    asyncio.run(_serve(settings))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from proxy.embedding.packs import PackError, install_pack, list_packs

    data_dir = args.data_dir or load_settings().data_dir
    if args.action == "list":
        for st in list_packs(data_dir):
            print(f"{st.name:24s} {'installed' if st.installed else '-':10s} {st.description}")
        return 0
    try:
        path = install_pack(args.name, data_dir, progress=True)
    except PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"installed {args.name} -> {path}")
    return 0


def cmd_check_policy(args: argparse.Namespace) -> int:
    from rich.table import Table

    from proxy.core.policy import PolicyError, load_policy
    from proxy.core.policy_table import policy_table

    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = policy_table(policy)
    model = f", calibrated for {policy.embedding_model}" if policy.embedding_model else ""
    table = Table(title=f"{args.file} (version {policy.version}{model})")
    for col in rows[0] if rows else []:
        table.add_column(col)
    for row in rows:
        table.add_row(*row.values())
    table_console().print(table)
    return 0


def _load_convs(paths: list[Path]) -> list[Any]:
    from proxy.tools.datasets.traces import load_traces

    return load_traces(paths)


def _dir_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", dest="data_dir", type=Path, help="default: .smartcache")
    p.add_argument("--model-home", dest="model_home", type=Path, help="packs live in <dir>/models; default: data dir")


def _replay_settings(args: argparse.Namespace) -> Settings:
    names = ("policy", "embedding_model", "data_dir", "model_home")
    return load_settings(overrides={n: getattr(args, n, None) for n in names})


def _replay_rows(
    args: argparse.Namespace, *, shadow: bool, settings: Settings | None = None, verify_all: bool = False
) -> list[Any]:
    from rich.progress import Progress

    from proxy.tools.replay import run_replay

    convs = _load_convs(args.traces)
    settings = settings or _replay_settings(args)
    with Progress(transient=True) as bar:
        task = bar.add_task("replay" if not shadow else "shadow replay", total=len(convs))

        def advance(n: int) -> None:
            bar.advance(task, n)

        return asyncio.run(run_replay(convs, settings=settings, shadow=shadow, progress=advance, verify_all=verify_all))


def cmd_replay(args: argparse.Namespace) -> int:
    from proxy.tools.report import print_summary, write_report

    if args.report and args.plots and importlib.util.find_spec("matplotlib") is None:
        # said before the replay runs, not after minutes of it
        print('smartcache replay: plots need matplotlib: pip install "smartcache[report]"', file=sys.stderr)
        print("(or pass --no-plots for the tables alone)", file=sys.stderr)
        return 2
    configure_logging("warning")
    rows = _replay_rows(args, shadow=False)
    print_summary(rows, table_console())
    if args.report:
        shadow = _replay_rows(args, shadow=True) if args.plots else []
        print(f"report: {write_report(args.report, rows, shadow)}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from proxy.core.policy import load_policy
    from proxy.tools.calibrate import calibrate, calibrate_verifier, describe_kept, describe_verified, verifier_curve
    from proxy.tools.calibrated_policy import write_policy
    from proxy.tools.held_out import held_out
    from proxy.tools.learned_levels import print_trace_levels, trace_levels
    from proxy.tools.report import print_calibration, print_held_out, print_verifier_curve

    configure_logging("warning")
    settings = _replay_settings(args)
    template = load_policy(settings.policy_file)
    rows = _replay_rows(args, shadow=True, settings=settings, verify_all=args.verify_all)
    results = calibrate(rows, template=template, target=args.target_false_hit)
    verify_target = args.target_false_hit if args.verify_target is None else args.verify_target
    verified = calibrate_verifier(rows, target=verify_target)
    previous = calibrate_verifier(rows, target=verify_target, setting="verify_previous")
    print_calibration(results, table_console())
    print(*describe_verified(verified), *describe_verified(previous), sep="\n")
    for setting in ("verify_accept", "verify_previous"):
        print_verifier_curve(verifier_curve(rows, setting=setting), table_console())
    print_held_out(held_out(rows, template=template, target=args.target_false_hit), table_console())
    print_trace_levels(trace_levels(rows, template, max_error=args.max_error), table_console())
    if (kept := describe_kept(results)) is not None:
        print(kept, file=sys.stderr)
    if args.out:
        version = write_policy(
            settings.policy_file,
            args.out,
            results,
            traces=[str(p) for p in args.traces],
            target=args.target_false_hit,
            embedding_model=settings.embedding_model,
            verified=verified,
            previous=previous,
            verify_target=verify_target,
        )
        print(f"wrote {args.out} (version {version})")
    return 0


def cmd_warm(args: argparse.Namespace) -> int:
    from proxy.tools.warm import WarmTarget, warm

    configure_logging("warning")
    settings = settings_from(args)
    target = WarmTarget(model=args.model, api_key=args.api_key, keep_sessions=args.keep_sessions)
    written, skipped = asyncio.run(warm(_load_convs(args.conversations), settings, target=target))
    print(f"warm: {written} records written, {skipped} already present, into {settings.data_dir}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    import httpx

    from proxy.tools.stats import fetch_snapshot, print_stats

    try:
        snapshot = fetch_snapshot(args.url)
    except httpx.HTTPError as exc:
        print(f"error: cannot read metrics from {args.url}: {exc}", file=sys.stderr)
        return 2
    print_stats(snapshot, table_console())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from proxy.tools.demo import demo_settings, run_demo

    settings = demo_settings(load_settings(), port=args.port, data_dir=args.data_dir)
    configure_logging("warning")  # the table is the output; the canonical lines would bury it
    asyncio.run(run_demo(settings, once=args.once))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smartcache", description="Multi-turn semantic cache proxy")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    _serve_args(serve)
    serve.set_defaults(func=cmd_serve)
    models = sub.add_parser("models", help="list or install offline embedding packs")
    models.add_argument("action", choices=["list", "install"])
    models.add_argument("name", nargs="?", default=Settings.embedding_model)
    models.add_argument("--data-dir", type=Path)
    models.set_defaults(func=cmd_models)
    check = sub.add_parser("check-policy", help="validate a policy file and print its table")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_check_policy)
    replay = sub.add_parser("replay", help="replay traces through the cache offline and report")
    replay.add_argument("traces", nargs="+", type=Path)
    replay.add_argument("--policy", type=Path)
    replay.add_argument("--embedding-model", dest="embedding_model", help="pack to embed with (default: settings)")
    replay.add_argument("--report", type=Path, help="folder for an HTML report with plots")
    replay.add_argument("--no-plots", dest="plots", action="store_false")
    _dir_args(replay)
    replay.set_defaults(func=cmd_replay)
    cal = sub.add_parser("calibrate", help="choose per-intent thresholds for a target false-hit rate")
    cal.add_argument("traces", nargs="+", type=Path)
    cal.add_argument("--target-false-hit", type=float, default=1e-3)
    cal.add_argument(
        "--verify-target",
        type=float,
        help="false-hit target of the verifier's levels, among the hits it admits (default: --target-false-hit)",
    )
    cal.add_argument(
        "--verify-all",
        action="store_true",
        help="have the pair verifier read every cacheable intent's candidates and previous turns, not only "
        "those of the intents the template verifies: its curve shows where it could serve",
    )
    cal.add_argument(
        "--max-error",
        type=float,
        help="the learned levels' target for the level table (default: each intent's max_error, else 0.005); "
        "the verifier scores only the intents that verify, so use --verify-all for every intent's levels",
    )
    cal.add_argument("--policy", type=Path, help="template policy (default: the one shipped for the pack)")
    cal.add_argument("--embedding-model", dest="embedding_model", help="pack to calibrate for (default: settings)")
    cal.add_argument("--out", type=Path)
    _dir_args(cal)
    cal.set_defaults(func=cmd_calibrate)
    warm = sub.add_parser(
        "warm",
        help="write past conversations into the cache as ready records (proxy stopped)",
        description="Write past conversations into a data dir's cache as ready records. Run it with the proxy "
        "stopped: warm takes the data dir's lock, as a proxy does, and refuses a data dir a running proxy "
        "holds, whose index in memory would never serve the records (a proxy started meanwhile is refused "
        "too). With the Redis store, give warm a --data-dir of its own: the running replicas pick the "
        "records up from Redis.",
    )
    warm.add_argument("conversations", nargs="+", type=Path)
    warm.add_argument("--model", required=True, help="the model name clients send: records are kept per model")
    warm.add_argument(
        "--api-key",
        dest="api_key",
        help="the API key clients send (only its salted hash is stored); default: each conversation's tenant",
    )
    warm.add_argument(
        "--keep-sessions",
        dest="keep_sessions",
        action="store_true",
        help="key records by the traces' session ids, for clients that send them as x-smartcache-session "
        "(default: the session the proxy derives for clients that send none)",
    )
    warm.add_argument("--config", type=Path, help="YAML settings file")
    warm.add_argument("--policy", type=Path)
    warm.add_argument("--data-dir", dest="data_dir", type=Path)
    warm.add_argument("--embedding-model", dest="embedding_model")
    warm.set_defaults(func=cmd_warm)
    stats = sub.add_parser("stats", help="print hit rate, precision_hit, saved tokens, pollution and stage timings")
    stats.add_argument("--url", default="http://127.0.0.1:8080", help="the proxy (its /metrics is read)")
    stats.set_defaults(func=cmd_stats)
    demo = sub.add_parser("demo", help="start engine + proxy, replay a bilingual conversation, keep serving")
    demo.add_argument("--port", type=int, help="proxy port (default: the serve default; 0 = any free port)")
    demo.add_argument("--data-dir", dest="data_dir", type=Path, help="default: <data_dir>/demo")
    demo.add_argument("--once", action="store_true", help="exit after the table instead of serving on")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (SettingsError, ValueError, EngineError) as exc:
        # SettingsError, PolicyError, TraceError, PackError: all say file, key and fix; EngineError
        # what to install or where the engine's log is
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
