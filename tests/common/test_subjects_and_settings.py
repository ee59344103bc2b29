"""Subject names and the settings pattern."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hami_common import subjects
from hami_common.errors import InvalidInput
from hami_common.settings import BusSettings, load, setting, to_argv


def test_node_names_with_dots_map_to_one_token_and_back() -> None:
    subject = subjects.placement("gpu-1.example.com")
    assert subject.count(".") == subjects.PLACEMENT.count(".") + 1
    token = subject.rsplit(".", 1)[1]
    assert subjects.node_from_token(token) == "gpu-1.example.com"


def test_distinct_nodes_never_share_a_subject_or_consumer() -> None:
    names = ["a.b", "a-b", "ab", "a.b.c"]
    assert len({subjects.placement(n) for n in names}) == len(names)
    assert len({subjects.placement_consumer(n) for n in names}) == len(names)


@pytest.mark.parametrize("name", ["", "UPPER", "has space", "star*", "gt>", "a..b", "-lead", "x" * 254])
def test_names_that_are_not_kubernetes_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput):
        subjects.usage(name)


def test_every_subject_sits_below_the_wildcard_of_its_kind() -> None:
    for prefix, make in [
        (subjects.ADMISSION, subjects.admission),
        (subjects.PLACEMENT, subjects.placement),
        (subjects.ALLOCATED, subjects.allocated),
        (subjects.INVENTORY, subjects.inventory),
        (subjects.USAGE, subjects.usage),
    ]:
        assert make("node-1").startswith(subjects.wildcard(prefix)[:-1])


@dataclass(frozen=True, slots=True)
class DemoSettings(BusSettings):
    """Demo service."""

    http_port: int = setting(8443, "HTTP port")
    verbose: bool = setting(False, "log more")
    ratio: float = setting(0.5, "a ratio")
    peers: tuple[str, ...] = setting((), "peer names")


def test_defaults_apply_without_flags_or_environment() -> None:
    s = load(DemoSettings, [], env={})
    assert (s.http_port, s.verbose, s.peers, s.nats_url) == (8443, False, (), BusSettings().nats_url)


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    env = {"HAMI_HTTP_PORT": "9000", "HAMI_VERBOSE": "true", "HAMI_PEERS": "a, b", "HAMI_RATIO": "0.25"}
    s = load(DemoSettings, [], env=env)
    assert (s.http_port, s.verbose, s.peers, s.ratio) == (9000, True, ("a", "b"), 0.25)
    s = load(DemoSettings, ["--http-port", "9100", "--no-verbose"], env=env)
    assert (s.http_port, s.verbose) == (9100, False)


def test_to_argv_gives_the_flags_that_load_turns_back_into_the_same_settings() -> None:
    wanted = DemoSettings(http_port=9100, verbose=True, ratio=0.25, peers=("a", "b"), nats_url="nats://x:1")
    argv = to_argv(wanted)
    assert "--http-port=9100" in argv
    assert "--verbose" in argv
    assert load(DemoSettings, argv, env={"HAMI_VERBOSE": "false", "HAMI_HTTP_PORT": "1"}) == wanted
    assert to_argv(DemoSettings()) == []  # defaults are left to the defaults
    assert load(DemoSettings, to_argv(DemoSettings(verbose=False)), env={"HAMI_VERBOSE": "1"}).verbose is True


def test_malformed_environment_value_names_the_variable() -> None:
    with pytest.raises(InvalidInput, match="HAMI_HTTP_PORT"):
        load(DemoSettings, [], env={"HAMI_HTTP_PORT": "eighty"})


def test_help_lists_every_flag_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        load(DemoSettings, ["--help"], env={})
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag, var in [
        ("--http-port", "HAMI_HTTP_PORT"),
        ("--nats-url", "HAMI_NATS_URL"),
        ("--verbose", "HAMI_VERBOSE"),
    ]:
        assert flag in out
        assert var in out


def test_malformed_flag_exits_with_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        load(DemoSettings, ["--http-port", "eighty"], env={})
    assert exited.value.code == 2
