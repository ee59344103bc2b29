"""NATS auth callout: one identity per node, proven by the node's Kubernetes service-account token."""
