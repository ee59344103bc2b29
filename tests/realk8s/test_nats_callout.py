"""The NATS auth callout's TokenReview against the real kube-apiserver: which tokens prove a node.

The node DaemonSet's pods send their projected token (audience ``hami-nats``, bound to the pod and its node);
hami-natsauth, as the ServiceAccount the deployed RBAC lets create TokenReviews and nothing else, asks the
apiserver who the bearer is and grants that node's NATS identity only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hami_common.errors import Forbidden, InvalidInput
from hami_common.kube import KubeClient, KubeSettings
from hami_natsauth.settings import NatsAuthSettings
from hami_natsauth.verifier import TokenReviewVerifier
from hami_sim.realk8s import SYSTEM_NAMESPACE, ApiError, ControlPlane, apply, deployed, rbac_documents

NODE = "callout-node"
CALLOUT = NatsAuthSettings()


@pytest.fixture
async def verifier(plane: ControlPlane, tmp_path: Path) -> AsyncIterator[TokenReviewVerifier]:
    """The verifier as deployed: the hami-nats ServiceAccount's token, the deployed RBAC, the default settings."""
    apply(plane.binaries, plane.write_kubeconfig(tmp_path / "admin"), rbac_documents(deployed(plane.binaries)))
    try:
        plane.create("", "v1", "nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    except ApiError as err:
        if err.status != 409:
            raise
    kubeconfig = plane.write_token_kubeconfig(tmp_path / "natsauth", plane.token(SYSTEM_NAMESPACE, "hami-nats"))
    async with KubeClient.from_settings(KubeSettings(kubeconfig=str(kubeconfig))) as kube:
        yield TokenReviewVerifier(kube, username=CALLOUT.node_service_account, audience=CALLOUT.token_audience)


async def test_a_node_bound_token_for_the_bus_proves_its_node(
    plane: ControlPlane, verifier: TokenReviewVerifier
) -> None:
    token = plane.token(SYSTEM_NAMESPACE, "hami-node", node=NODE, audiences=[CALLOUT.token_audience])
    assert await verifier.node_of(token) == NODE


@pytest.mark.parametrize(
    ("account", "node", "audiences", "why"),
    [
        pytest.param("hami-node", NODE, (), "audience", id="a token for the apiserver, not the bus"),
        pytest.param("hami-node", "", ("hami-nats",), "not bound to a node", id="a token bound to no node"),
        pytest.param("hami-webhook", NODE, ("hami-nats",), "not of the node services", id="another account"),
    ],
)
async def test_other_tokens_prove_no_node(
    plane: ControlPlane, verifier: TokenReviewVerifier, account: str, node: str, audiences: tuple[str, ...], why: str
) -> None:
    token = plane.token(SYSTEM_NAMESPACE, account, node=node, audiences=audiences)
    with pytest.raises(InvalidInput, match=why):
        await verifier.node_of(token)
    with pytest.raises(InvalidInput, match="not authenticated"):
        await verifier.node_of(token[:-4] + "AAAA")


async def test_the_callout_account_may_review_tokens_and_nothing_else(plane: ControlPlane, tmp_path: Path) -> None:
    token = plane.token(SYSTEM_NAMESPACE, "hami-nats")
    kubeconfig = plane.write_token_kubeconfig(tmp_path / "natsauth", token)
    async with KubeClient.from_settings(KubeSettings(kubeconfig=str(kubeconfig))) as kube:
        with pytest.raises(Forbidden):
            await kube.get_node(NODE)
