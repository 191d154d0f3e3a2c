"""The standard gRPC health service (`grpc.health.v1.Health`) as load balancers and
Kubernetes' gRPC probes call it, with grpcio: Check and Watch, NOT_SERVING until the model
is warm, SERVING once it is, NOT_FOUND for a service the server does not have."""

import grpc
import pytest


SERVING, NOT_SERVING = 1, 2
SERVICES = ["", "inference.GRPCInferenceService"]


# The two messages have one field each, so they are written and read by hand rather than
# compiled from health.proto: HealthCheckRequest {string service = 1} and
# HealthCheckResponse {ServingStatus status = 1} (a one-byte varint; absent means UNKNOWN).
def request(service):
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name if name else b""


def status(response):
    assert response in (b"", b"\x08\x00", b"\x08\x01", b"\x08\x02", b"\x08\x03"), response
    return response[1] if response else 0


def health(channel):
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=request, response_deserializer=status)
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                 request_serializer=request, response_deserializer=status)
    return check, watch


def test_check_and_watch_on_a_ready_server(server):
    with grpc.insecure_channel(server.grpc) as channel:
        check, watch = health(channel)
        for service in SERVICES:
            # Health follows readiness within a moment (the server re-reads it every
            # 200 ms): Watch until it says SERVING, then Check must agree.
            updates = watch(service, timeout=10)
            assert SERVING in updates, service
            updates.cancel()
            assert check(service, timeout=10) == SERVING, service
        with pytest.raises(grpc.RpcError) as e:
            check("no.such.Service", timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        updates = watch("", timeout=10)
        assert next(updates) == SERVING
        updates.cancel()
        with pytest.raises(grpc.RpcError) as e:
            next(watch("no.such.Service", timeout=10))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_not_serving_while_warming_up_then_serving(launch_server):
    # Warming eight batch sizes (1 + 2 + ... + 8 images) takes seconds, so the first Check
    # lands while the model is still loading.
    proc, _, address = launch_server(["--max-batch", "8"])
    try:
        with grpc.insecure_channel(address) as channel:
            check, watch = health(channel)
            assert check("", timeout=10) == NOT_SERVING
            assert check(SERVICES[1], timeout=10) == NOT_SERVING
            # Watch reports the current status, then each change: SERVING once warm.
            updates = watch("", timeout=180)
            assert next(updates) == NOT_SERVING
            assert next(updates) == SERVING
            updates.cancel()
            for service in SERVICES:
                assert check(service, timeout=10) == SERVING, service
    finally:
        proc.terminate()
        proc.wait(30)
