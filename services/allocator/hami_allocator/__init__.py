"""The allocator: HAMi's kubelet device plugin (gRPC ``v1beta1`` over a unix socket).

* :mod:`.api` — the proto, its generated stubs and the typed glue (:mod:`.api.rpc`);
* :mod:`.server` — the plugin's socket, registration with ``kubelet.sock``, re-registration on kubelet restart;
* :mod:`.plugin` — the ``DevicePlugin`` service: the gRPC edge, where errors become status codes;
* :mod:`.allocator` — Allocate and GetPreferredAllocation: the staged answer, else HAMi's annotation fallback
  (:mod:`.pending`); :mod:`.followup` — what happens after the reply (erasure, bind-phase, lock, bus);
* :mod:`.inventory` — the GPUs (declared, or the node agent's discovery) and their virtual devices;
* :mod:`.service` and :mod:`.main` — assembly and the ``hami-allocator`` entry point.
"""
