"""How an apiserver status code becomes one of the project's errors (hami_common.kube's one mapping)."""

from __future__ import annotations

import pytest

from hami_common.errors import Conflict, Forbidden, HamiError, InvalidInput, NotFound, TransientError
from hami_common.kube._errors import from_status


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        pytest.param(404, NotFound, id="404 is NotFound"),
        pytest.param(409, Conflict, id="409 is Conflict"),
        pytest.param(403, Forbidden, id="403 is Forbidden (a restarted apiserver says it before RBAC is synced)"),
        pytest.param(401, Forbidden, id="401 is Forbidden"),
        pytest.param(422, InvalidInput, id="422 is InvalidInput"),
        pytest.param(429, TransientError, id="429 is worth retrying"),
        pytest.param(503, TransientError, id="503 is worth retrying"),
        pytest.param(0, TransientError, id="no answer is worth retrying"),
    ],
)
def test_status_codes_map_to_one_error_each(code: int, kind: type[HamiError]) -> None:
    error = from_status(code, "pod default/p: refused")
    assert type(error) is kind
    assert str(error) == "pod default/p: refused"


def test_forbidden_is_still_invalid_input_for_callers_that_treat_any_4xx_alike() -> None:
    assert isinstance(from_status(403, "x"), InvalidInput)
