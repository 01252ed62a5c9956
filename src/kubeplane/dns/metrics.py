"""Prometheus metrics of the DNS server, with CoreDNS's names (so that its
dashboards read them): ``coredns_dns_requests_total`` (by protocol, address
family and query type), ``coredns_dns_responses_total`` (by rcode),
``coredns_cache_hits_total`` and ``coredns_cache_misses_total``. The server
counts in plain counters; this collector reads them at scrape time, so a
query pays no metrics library call."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily

#: the server block's zone label: the one block serves every name, as kubeadm's Corefile
ZONE = "."


class DNSCollector:
    def __init__(self, server: Callable[[], Any]) -> None:
        #: returns the running DNSServer, or None
        self.server = server

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        srv = self.server()
        if srv is None:
            return
        addr = f"dns://{'[' + srv.host + ']' if ':' in srv.host else srv.host}:{srv.port}"
        family = "2" if ":" in srv.host else "1"
        requests = CounterMetricFamily("coredns_dns_requests", "Counter of DNS requests made per zone, protocol "
                                       "and family.", labels=["server", "zone", "proto", "family", "type"])
        for (proto, qtype), n in sorted(srv.requests.items()):
            requests.add_metric([addr, ZONE, proto, family, qtype], n)
        yield requests
        responses = CounterMetricFamily("coredns_dns_responses", "Counter of response status codes.",
                                        labels=["server", "zone", "rcode"])
        for rcode, n in sorted(srv.responses.items()):
            responses.add_metric([addr, ZONE, rcode], n)
        yield responses
        hits = CounterMetricFamily("coredns_cache_hits", "The count of cache hits.", labels=["server", "type"])
        hits.add_metric([addr, "success"], srv.stats["cache_hits"])
        yield hits
        misses = CounterMetricFamily("coredns_cache_misses", "The count of cache misses.", labels=["server"])
        misses.add_metric([addr], srv.stats["cache_misses"])
        yield misses
