"""The one error tree of fabricpace.

    FabricpaceError                 anything fabricpace raises on purpose
    ├── InputError                  bad user input: a file, a field, an option (CLI exit code 2)
    │   ├── ConfigError             cluster / workload / noise / scenario files
    │   ├── ParseError              logs and traces that cannot be read (nccl-tests, kineto, ...)
    │   └── RunDirError             a run directory that is missing, empty or mixed
    ├── ObserverError               failures inside the in-process observer (never reach training)
    ├── LabError                    the fabric lab could not be built or torn down
    └── SimulationError             the simulator reached an impossible state

Errors are translated at the boundary with ``raise ... from exc``; the CLI prints one line for every
InputError and exits with 2.
"""

from __future__ import annotations


class FabricpaceError(Exception):
    """Base of every error fabricpace raises on purpose."""


class InputError(FabricpaceError):
    """Bad user input. The message names the file/field and how to fix it (CLI exit code 2)."""


class ConfigError(InputError):
    """A cluster, workload, noise or scenario file (or preset name) is invalid."""


class ParseError(InputError):
    """A log or trace file cannot be parsed."""


class RunDirError(InputError):
    """A run directory is missing, empty, mixed or unreadable."""


class ObserverError(FabricpaceError):
    """A failure inside the observer; the observer degrades to a no-op when it sees one."""


class LabError(FabricpaceError):
    """The fabric lab could not be built, used or torn down."""


class SimulationError(FabricpaceError):
    """The simulator reached a state it cannot continue from."""
