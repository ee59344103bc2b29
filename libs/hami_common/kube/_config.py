"""Building the official client's ``ApiClient``: in-cluster, or from a kubeconfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from hami_common.errors import InvalidInput
from hami_common.kube._settings import KubeSettings

__all__ = ["load_api_client"]


def load_api_client(settings: KubeSettings) -> Any:
    """An ``ApiClient`` for ``settings``: the kubeconfig when one is named, otherwise the in-cluster service
    account, otherwise ``$KUBECONFIG`` / ``~/.kube/config``. Raises InvalidInput, saying what to check, if
    none works: a missing or unreadable file, YAML that does not parse, a context it does not have."""
    if settings.kubeconfig and not Path(settings.kubeconfig).is_file():
        raise InvalidInput(f"kubeconfig {settings.kubeconfig}: no such file")
    try:
        if settings.kubeconfig:
            return config.new_client_from_config(settings.kubeconfig, context=settings.kube_context or None)  # type: ignore[no-untyped-call]
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except ConfigException:
            return config.new_client_from_config(context=settings.kube_context or None)  # type: ignore[no-untyped-call]
    except yaml.YAMLError as err:
        where = settings.kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise InvalidInput(f"kubeconfig {where} is not valid YAML: {' '.join(str(err).split())}") from err
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError) as err:
        # the client reads a malformed kubeconfig with plain indexing: any of these means "not usable"
        where = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "no usable Kubernetes configuration"
        context = f" (context {settings.kube_context!r})" if settings.kube_context else ""
        raise InvalidInput(f"{where}{context}: {' '.join(str(err).split()) or type(err).__name__}") from err
