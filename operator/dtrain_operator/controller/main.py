"""`dtrain operator`: kopf with dtrain's handlers, settings, health and metrics endpoints."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import sys
import uuid
from pathlib import Path

import aiohttp.web
import kopf

from dtrain_operator.api import contract
from dtrain_operator.api.job_defaults import JobDefaults, JobDefaultsError
from dtrain_operator.api.redaction import redact_text
from dtrain_operator.api.validation import parse_job_defaults
from dtrain_operator.controller.handlers import build_registry
from dtrain_operator.controller.kube import KubeClient, RateLimiter, load_configuration
from dtrain_operator.controller.leader import LeaderElectionConfig, LeaderElector
from dtrain_operator.controller.metrics import OperatorMetrics
from dtrain_operator.controller.reconciler import Controller
from dtrain_operator.controller.report_server import ReportServer
from dtrain_operator.controller.report_tls import ReportTLS, ReportTLSError, load_report_tls, service_names
from dtrain_operator.core.launch_env import ReportEndpoint
from dtrain_operator.core.observation import Limits
from dtrain_operator.core.tenancy import Tenancy

logger = logging.getLogger(__name__)


def operator_settings(args: argparse.Namespace) -> kopf.OperatorSettings:
    """kopf's settings: bookkeeping under dtrain.dev/, watch timeouts, server-side selectors."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = contract.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=contract.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=contract.KOPF_PREFIX)
    # kopf's own events only for warnings and errors; dtrain posts one Event per phase change itself.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "dtrain-operator"
    # One active operator (leader election, or a single replica): no kopf peering objects.
    settings.peering.standalone = True
    # The served resources are found once at startup: no cluster-wide watch of CRDs and namespaces.
    settings.scanning.disabled = True
    # The API server ends each watch after this; the client gives up a little later, so that a
    # stream that went silent without closing is re-opened (from the last resourceVersion).
    settings.watching.server_timeout = args.watch_timeout
    settings.watching.client_timeout = args.watch_timeout + max(5.0, args.watch_timeout * 0.1)
    settings.watching.connect_timeout = min(30.0, float(args.watch_timeout))
    settings.networking.connect_timeout = 30.0
    settings.networking.request_timeout = 60.0
    # Only the operator's children are watched: the API server filters, not the operator.
    settings.watching.label_selectors["pods"] = contract.LABEL_JOB_NAME
    settings.watching.label_selectors["batch", "jobs"] = contract.LABEL_JOB_NAME
    return settings


class RedactingFilter(logging.Filter):
    """Masks credentials in every record: API errors quote objects, and pods' messages quote logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True


def configure_logging(level: str, log_format: str) -> None:
    kopf.configure(
        debug=level == "DEBUG",
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(level)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    # kopf reports every handled event at INFO; that is debugging detail for dtrain's users.
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, logging.getLevelName(level)))


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def operator_namespace() -> str:
    """The operator's own namespace: $POD_NAMESPACE, else its service account's, else default."""
    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace and SERVICE_ACCOUNT_NAMESPACE.is_file():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return namespace or "default"


SERVICE_ACCOUNT_TOKEN = SERVICE_ACCOUNT_NAMESPACE.with_name("token")


def api_audiences() -> frozenset[str]:
    """The audiences the API server accepts, as the operator's own token names them (none outside a pod)."""
    try:
        payload = SERVICE_ACCOUNT_TOKEN.read_text().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (OSError, IndexError, ValueError):
        return frozenset()
    audience = claims.get("aud") if isinstance(claims, dict) else None
    audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    return frozenset(a for a in audiences if isinstance(a, str) and a)


def tenancy(args: argparse.Namespace) -> Tenancy:
    return Tenancy(
        operator_namespace=operator_namespace(),
        operator_service_account=args.service_account,
        trainer_service_account=args.trainer_service_account,
        allowed_service_accounts=frozenset(args.allowed_service_accounts),
        operator_secrets=frozenset({args.report_tls_secret}),
        api_audiences=api_audiences(),
    )


async def report_certificate(args: argparse.Namespace, metrics: OperatorMetrics) -> ReportTLS | None:
    """With reports on, the report endpoint's certificate (report_tls.py); credentials are loaded either way."""
    client = KubeClient(await load_configuration(), RateLimiter(5.0, 5), metrics)
    try:
        if not args.report_service:
            return None
        return await load_report_tls(client, operator_namespace(), args.report_tls_secret, args.report_service)
    finally:
        await client.close()


def report_endpoint(args: argparse.Namespace, tls: ReportTLS | None) -> ReportEndpoint | None:
    if tls is None:
        return None
    return ReportEndpoint(f"https://{service_names(args.report_service, operator_namespace())[0]}:{args.report_port}", tls.ca_pem)


def election_config(args: argparse.Namespace) -> LeaderElectionConfig:
    namespace = args.leader_elect_resource_namespace or operator_namespace()
    # The pod's name is unique while it lives (a restarted container takes its Lease back at once);
    # outside a pod, the host name with a random suffix, as kube-controller-manager does.
    identity = os.environ.get("POD_ID") or f"{socket.gethostname()}_{uuid.uuid4()}"
    return LeaderElectionConfig(
        namespace=namespace,
        name=args.leader_elect_resource_name,
        identity=identity,
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
    )


async def _standby_health(_: aiohttp.web.Request) -> aiohttp.web.Response:
    return aiohttp.web.json_response({"leader": False})


async def stand_by(
    config: LeaderElectionConfig, health_port: int, metrics: OperatorMetrics, reports: ReportServer | None
) -> None:
    """Wait for the Lease, answering /healthz meanwhile (a standby is healthy) and every report with 503
    (the trainer tries the leader's address next); kopf serves /healthz once leading."""
    app = aiohttp.web.Application()
    app.router.add_get("/healthz", _standby_health)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "0.0.0.0", health_port)
    await site.start()
    if reports is not None:
        await reports.start()
    client = KubeClient(await load_configuration(), RateLimiter(5.0, 5), metrics)
    try:
        await LeaderElector(config, client).acquire()
    finally:
        await client.close()
        await runner.cleanup()
        if reports is not None:
            await reports.stop()


async def release(config: LeaderElectionConfig, metrics: OperatorMetrics) -> None:
    """A clean stop: give the Lease up, so that a standby takes over at its next retry."""
    client = KubeClient(await load_configuration(), RateLimiter(5.0, 5), metrics)
    try:
        elector = LeaderElector(config, client)
        elector.leading = True
        await asyncio.wait_for(elector.release(), timeout=5.0)
    except asyncio.TimeoutError:
        logger.warning("leader election: releasing the lease took too long; it expires by itself")
    finally:
        await client.close()


def argument_problem(args: argparse.Namespace) -> str | None:
    if args.qps <= 0 or args.burst < 1:
        return "--qps must be above 0 and --burst at least 1"
    if args.watch_timeout < 1:
        return "--watch-timeout must be at least 1 second"
    if not 1 <= args.report_port <= 65535:
        return "--report-port must be a port number (1-65535)"
    for pair in args.allowed_service_accounts:
        namespace, _, name = pair.partition("/")
        if not namespace or not name or "/" in name:
            return f"--allow-service-account {pair!r}: give it as NAMESPACE/NAME"
    return None


def job_defaults(args: argparse.Namespace) -> JobDefaults:
    if not args.job_defaults:
        return JobDefaults()
    try:
        text = Path(args.job_defaults).read_text()
    except OSError as exc:
        raise JobDefaultsError(f"--job-defaults {args.job_defaults}: {exc.strerror}") from exc
    return parse_job_defaults(text, f"--job-defaults {args.job_defaults}")


def checked_arguments(args: argparse.Namespace) -> tuple[str | None, JobDefaults]:
    """What is wrong with the flags (one line, or None), and the job defaults they name."""
    try:
        return argument_problem(args), job_defaults(args)
    except JobDefaultsError as exc:
        return str(exc), JobDefaults()


def main(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    problem, defaults = checked_arguments(args)
    if problem:
        print(f"dtrain operator: {problem}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(args, defaults))
    except KeyboardInterrupt:
        return 0


async def serve(args: argparse.Namespace, defaults: JobDefaults) -> int:
    """The operator in one event loop: its certificate, the wait for the Lease, kopf, the Lease given up."""
    metrics = OperatorMetrics()
    try:
        # Fail at once, with one line, without credentials (kopf would retry every minute) or without
        # the report endpoint's certificate.
        tls = await report_certificate(args, metrics)
    except (kopf.LoginError, ReportTLSError) as exc:
        print(f"dtrain operator: {exc}", file=sys.stderr)
        return 1
    try:
        metrics.serve(args.metrics_port)
    except OSError as exc:
        print(f"dtrain operator: cannot serve metrics on port {args.metrics_port}: {exc.strerror}", file=sys.stderr)
        return 1
    election: LeaderElectionConfig | None = None
    if args.leader_elect:
        election = election_config(args)
        problem = election.check()
        if problem:
            print(f"dtrain operator: {problem}", file=sys.stderr)
            return 2
        logger.info("leader election: %s wants the lease %s/%s", election.identity, election.namespace, election.name)
        await stand_by(election, args.health_port, metrics, ReportServer(tls, args.report_port) if tls else None)
    controller = Controller(
        metrics=metrics,
        qps=args.qps,
        burst=args.burst,
        network_policy=args.network_policy,
        refuse_host_access=args.refuse_host_access,
        tenancy=tenancy(args),
        job_defaults=defaults,
        limits=Limits(stuck_terminating_seconds=args.stuck_terminating_timeout, image_pull_seconds=args.image_pull_timeout),
        election=election,
        report=report_endpoint(args, tls),
        report_tls=tls,
        report_port=args.report_port,
    )
    namespaces = args.namespaces or []
    scope = f"namespaces {', '.join(namespaces)}" if namespaces else "all namespaces"
    logger.info("dtrain operator starting: %s, health :%d, metrics :%d", scope, args.health_port, args.metrics_port)
    with contextlib.suppress(asyncio.CancelledError):
        await kopf.operator(
            registry=build_registry(controller),
            settings=operator_settings(args),
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        )
    if election is not None:
        await release(election, metrics)
    return 0
