"""Reading kube-apiserver's own counters: requests by verb and resource, writes, webhook calls; a later
reading minus an earlier one is what happened between them."""

from __future__ import annotations

from hami_sim.apicalls import api_calls, per_pod


def request(verb: str, resource: str, value: int, *, sub: str = "", code: int = 200, dry_run: str = "") -> str:
    """One ``apiserver_request_total`` line as kube-apiserver writes it."""
    labels = (
        f'code="{code}",component="apiserver",dry_run="{dry_run}",group="",resource="{resource}",'
        f'scope="resource",subresource="{sub}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


def webhook(operation: str, value: int, *, code: int = 200) -> str:
    labels = (
        f'code="{code}",name="vgpu.hami.io",operation="{operation}",rejected="{str(code != 200).lower()}",type="admit"'
    )
    return f"apiserver_admission_webhook_request_total{{{labels}}} {value}"


REQUESTS = (
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests\n# TYPE apiserver_request_total counter"
)
WEBHOOKS = "# TYPE apiserver_admission_webhook_request_total counter"

EARLIER = "\n".join(
    [
        REQUESTS,
        request("POST", "pods", 10, code=201),
        request("POST", "pods", 3, code=201, dry_run="All"),
        request("PATCH", "pods", 4, sub="status"),
        request("GET", "nodes", 7),
        WEBHOOKS,
        webhook("CREATE", 10),
        "",
    ]
)
LATER = "\n".join(
    [
        REQUESTS,
        request("POST", "pods", 14, code=201),
        request("POST", "pods", 1, code=409),
        request("POST", "pods", 4, sub="binding", code=201),
        request("PATCH", "pods", 4, sub="status"),
        request("GET", "nodes", 9),
        WEBHOOKS,
        webhook("CREATE", 14),
        webhook("UPDATE", 1, code=400),
        "",
    ]
)


def test_a_reading_counts_requests_by_verb_and_resource_leaving_dry_runs_out() -> None:
    calls = api_calls(EARLIER)
    assert calls.requests == {"POST pods": 10, "PATCH pods/status": 4, "GET nodes": 7}
    assert calls.writes == 14
    assert calls.webhooks == {"vgpu.hami.io CREATE": 10}


def test_the_difference_of_two_readings_is_what_happened_between_them() -> None:
    between = api_calls(LATER) - api_calls(EARLIER)
    # every code counts (a refused create is still a request); unchanged counters drop out
    assert between.requests == {"POST pods": 5, "POST pods/binding": 4, "GET nodes": 2}
    assert between.writes == 9
    assert between.webhooks == {"vgpu.hami.io CREATE": 4, "vgpu.hami.io UPDATE": 1}
    assert per_pod(between.requests, 4) == {"POST pods": 1.25, "POST pods/binding": 1.0, "GET nodes": 0.5}


def test_a_reading_without_those_families_counts_nothing() -> None:
    calls = api_calls("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
    assert calls.requests == {}
    assert calls.writes == 0
