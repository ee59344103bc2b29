"""Simulation and test aids shared by the test suite and the local stack.

* :mod:`hami_sim.kubeapi` — an in-process emulator of the part of the Kubernetes API this project uses.
* :mod:`hami_sim.waiting` — ``eventually()`` for tests where only polling can observe a condition.
"""
