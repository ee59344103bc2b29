"""Building the official client's ``ApiClient``: in-cluster, or from a kubeconfig."""

from __future__ import annotations

from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from hami_common.errors import InvalidInput
from hami_common.kube._settings import KubeSettings

__all__ = ["load_api_client"]


def load_api_client(settings: KubeSettings) -> Any:
    """An ``ApiClient`` for ``settings``: the kubeconfig when one is named, otherwise the in-cluster service
    account, otherwise ``$KUBECONFIG`` / ``~/.kube/config``. Raises InvalidInput if none works."""
    try:
        if settings.kubeconfig:
            return config.new_client_from_config(settings.kubeconfig, context=settings.kube_context or None)  # type: ignore[no-untyped-call]
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except ConfigException:
            return config.new_client_from_config(context=settings.kube_context or None)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as err:
        raise InvalidInput(f"no usable Kubernetes configuration: {err}") from err
