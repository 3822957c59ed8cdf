"""The report endpoint's certificates (controller/report_tls.py): a CA kept by the operator, and short-lived serving
certificates it signs, renewed in the running server's context; trainers trust the CA alone."""

from __future__ import annotations

import asyncio
import datetime
import ssl

from cryptography import x509

from dtrain_operator.controller.report_tls import RENEW_SECONDS, SERVING_VALIDITY, issue

NAMES = ["dtrain-operator.dtrain-system.svc", "dtrain-operator.dtrain-system.svc.cluster.local"]


def test_a_serving_certificate_is_short_lived_and_for_the_services_names():
    tls = issue(NAMES)
    cert_pem, key_pem = tls.serving_certificate()
    certificate = x509.load_pem_x509_certificate(cert_pem.encode())
    life = certificate.not_valid_after_utc - certificate.not_valid_before_utc
    assert life <= SERVING_VALIDITY + datetime.timedelta(minutes=5)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == NAMES
    ca = x509.load_pem_x509_certificate(tls.ca_pem.encode())
    certificate.verify_directly_issued_by(ca)
    assert "PRIVATE KEY" in key_pem and RENEW_SECONDS < SERVING_VALIDITY.total_seconds()


async def test_a_renewed_certificate_is_served_to_new_connections_and_trusted_through_the_ca():
    tls = issue(NAMES)
    context = tls.server_context()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cadata=tls.ca_pem)

    async def served_serial() -> int:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=NAMES[0])
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return x509.load_der_x509_certificate(der).serial_number

    try:
        first = await served_serial()
        assert tls.renew(context) == RENEW_SECONDS
        assert await served_serial() != first
    finally:
        server.close()
        await server.wait_closed()
