"""The fake inventory's MIG driver: instances kept in a JSON file that every process of the node shares.

On a real node the driver holds the instances, and the node agent and the allocator (separate processes) see the
same ones. Here a state file plays the driver: every call takes an exclusive ``flock`` on a lock file beside
it, reads the state, changes it and replaces it atomically, so two processes creating at once cannot both win
a placement. It refuses what a GPU refuses (:class:`MigRefused`): an unknown GPU, one not in MIG mode, a profile
the GPU does not offer, a placement the profile does not offer, one overlapping an existing instance. GPU
instance ids are the lowest free from 1, the compute instance is id 0 (as the driver numbers the first compute
instance of a GPU instance), and the MIG device UUID is ``MIG-<uuid4>``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from hami_common.annotations.registration import MigPlacement, MigProfile
from hami_common.errors import InvalidInput
from hami_common.inventory._fake import FakeInventory
from hami_common.inventory._mig import MigInstance, MigRefused

__all__ = ["FakeMigControl", "default_state_file", "discard_state"]


class _Instance(msgspec.Struct, frozen=True):
    profile: str
    start: int
    size: int
    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str


class _State(msgspec.Struct):
    gpus: dict[str, list[_Instance]] = msgspec.field(default_factory=dict)


_LOCK_SUFFIX: Final = ".lock"
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(_State)


def default_state_file(fake_file: Path | str, node: str) -> Path:
    """Where the node's processes keep the fake driver's state unless told: one file per inventory and node, in
    the temporary directory (the inventory's own directory may be read-only, e.g. ``examples/``)."""
    digest = hashlib.sha256(str(Path(fake_file).resolve()).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in node)
    return Path(tempfile.gettempdir()) / f"hami-fake-mig-{digest}-{safe}.json"


def discard_state(state_file: Path | str) -> None:
    """Remove a fake MIG driver's state and its lock file (a stack that stops leaves nothing in /tmp)."""
    path = Path(state_file)
    for leftover in (path, path.with_name(path.name + _LOCK_SUFFIX)):
        leftover.unlink(missing_ok=True)


def _overlaps(a: MigPlacement, start: int, size: int) -> bool:
    return a.start < start + size and start < a.start + a.size


class FakeMigControl:
    """:class:`~hami_common.inventory.MigControl` over the fake inventory of ``node`` and a shared state file."""

    def __init__(self, inventory: FakeInventory, state_file: Path | str) -> None:
        self.inventory = inventory
        self.state_file = Path(state_file)
        self._lock_file = self.state_file.with_name(self.state_file.name + _LOCK_SUFFIX)
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InvalidInput(f"fake MIG state {self.state_file}: {err.strerror or err}") from err

    # --- the shared state ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_State]:
        """The state under the exclusive lock; what the block leaves in it is written back."""
        with open(self._lock_file, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._read()
                before = _ENCODER.encode(state)
                yield state
                after = _ENCODER.encode(state)
                if after != before:
                    tmp = self.state_file.with_name(f"{self.state_file.name}.{os.getpid()}.tmp")
                    tmp.write_bytes(after)
                    tmp.replace(self.state_file)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> _State:
        try:
            data = self.state_file.read_bytes()
        except FileNotFoundError:
            return _State()
        try:
            return _DECODER.decode(data) if data.strip() else _State()
        except msgspec.DecodeError as err:
            raise InvalidInput(f"fake MIG state {self.state_file}: {err}") from err

    def _offered(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        gpu = next((g for g in self.inventory.gpus() if g.uuid == gpu_uuid), None)
        if gpu is None:
            raise MigRefused(f"GPU {gpu_uuid} is not on node {self.inventory.node}")
        if not gpu.mig:
            raise MigRefused(f"GPU {gpu_uuid} is not in MIG mode")
        return gpu.mig_profiles

    @staticmethod
    def _value(gpu_uuid: str, i: _Instance) -> MigInstance:
        return MigInstance(
            gpu_uuid=gpu_uuid,
            profile=i.profile,
            placement=MigPlacement(start=i.start, size=i.size),
            gpu_instance_id=i.gpu_instance_id,
            compute_instance_id=i.compute_instance_id,
            mig_uuid=i.mig_uuid,
        )

    # --- MigControl ----------------------------------------------------------------------------------------

    def profiles(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        gpu = next((g for g in self.inventory.gpus() if g.uuid == gpu_uuid), None)
        return () if gpu is None else gpu.mig_profiles

    def instances(self, gpu_uuid: str | None = None) -> tuple[MigInstance, ...]:
        with self._locked() as state:
            return tuple(
                self._value(uuid_, i)
                for uuid_, made in sorted(state.gpus.items())
                if gpu_uuid is None or uuid_ == gpu_uuid
                for i in made
            )

    def create(self, gpu_uuid: str, profile: str, placement: MigPlacement) -> MigInstance:
        offered = self._offered(gpu_uuid)
        spec = next((p for p in offered if p.name == profile), None)
        if spec is None:
            raise MigRefused(f"GPU {gpu_uuid} offers no MIG profile {profile!r}")
        if placement not in spec.placements:
            raise MigRefused(f"profile {profile} cannot be placed at {placement.start}:{placement.size}")
        with self._locked() as state:
            made = state.gpus.setdefault(gpu_uuid, [])
            for i in made:
                if i.profile == profile and (i.start, i.size) == (placement.start, placement.size):
                    return self._value(gpu_uuid, i)  # already there: creating is idempotent
                if _overlaps(placement, i.start, i.size):
                    raise MigRefused(
                        f"placement {placement.start}:{placement.size} overlaps GPU instance {i.gpu_instance_id} "
                        f"({i.profile} at {i.start}:{i.size}) on {gpu_uuid}"
                    )
            used = {i.gpu_instance_id for i in made}
            gi = next(n for n in range(1, len(used) + 2) if n not in used)
            created = _Instance(profile, placement.start, placement.size, gi, 0, f"MIG-{uuid.uuid4()}")
            made.append(created)
            return self._value(gpu_uuid, created)

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        with self._locked() as state:
            made = state.gpus.get(gpu_uuid)
            if not made:
                return
            kept = [i for i in made if i.gpu_instance_id != gpu_instance_id]
            if kept:
                state.gpus[gpu_uuid] = kept
            else:
                del state.gpus[gpu_uuid]
