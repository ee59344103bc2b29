"""The mutating admission webhook: HAMi's admission rules over AdmissionReview, TLS, quota, trace start.

* :func:`hami_webhook.app.create_app` — the FastAPI app (``POST /webhook``, ``GET /healthz``, ``GET /readyz``);
* :func:`hami_webhook.admission.admit` — the rules, pure: request in, :class:`~hami_webhook.admission.Verdict` out;
* :func:`hami_webhook.main.main` — the ``hami-webhook`` command.
"""
