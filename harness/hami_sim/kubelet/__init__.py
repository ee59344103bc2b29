"""A kubelet emulator for device plugins: the kubelet's side of ``v1beta1`` over real unix sockets.

It serves ``Registration`` on ``kubelet.sock``, dials each registering plugin back and asks for its options,
follows ``ListAndWatch``, and admits pods bound to its node the way the kubelet's device manager does:
one container at a time, init containers first, ``GetPreferredAllocation`` (when offered) then
``Allocate`` with exactly one container request. :meth:`KubeletEmulator.restart` behaves like a kubelet
restart: every socket in the directory is deleted and ``kubelet.sock`` is created again.
"""

from hami_sim.kubelet._kubelet import ContainerAdmission, KubeletEmulator, PluginView, PodAdmission

__all__ = ["ContainerAdmission", "KubeletEmulator", "PluginView", "PodAdmission"]
