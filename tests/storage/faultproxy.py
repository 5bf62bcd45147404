"""The fault-injecting, request-counting HTTP proxy lives in bench/faultproxy.py (the s3 bench counts
requests with it too); the storage tests import it from here as before."""

from bench.faultproxy import FaultProxy, request_kind

__all__ = ["FaultProxy", "request_kind"]
