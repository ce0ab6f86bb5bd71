"""Where a site profile's ``pinned: true`` takes effect: in the system profile only.

:func:`~hpcsuite.submit.config.site_location` pins ``/etc/hpcsuite/profile.yaml``
(:data:`~hpcsuite.submit.config.SYSTEM_DIR`, a constant nothing a user controls moves) and no
other file. The same line in a profile found through ``HPCSUITE_SITE_DIR``, or given with
``--profile`` or ``HPCSUITE_PROFILE``, does nothing: a user's own ``--profile`` still replaces
that profile. ``config show``, ``lint`` and ``doctor`` say so, so a site does not believe it
pinned what it did not.
"""

from __future__ import annotations

from pathlib import Path

from . import config
from .schema import read_yaml


def pinned_file() -> Path:
    """The one file whose ``pinned: true`` pins it: ``/etc/hpcsuite/profile.yaml``."""
    return config.SYSTEM_DIR / config.PROFILE_FILE


def pinned_in_vain(profile_path: str | None = None) -> tuple[str, str] | None:
    """What is wrong and what to do, when the site profile in force (``profile_path``: the one
    --profile or HPCSUITE_PROFILE names, else the one found) says ``pinned: true`` but is not
    the system profile; None when it is pinned, or says nothing of pinning."""
    location = config.site_location(profile_path)
    if location.pinned or location.profile is None:
        return None
    if read_yaml(str(location.profile)).get("pinned") is not True:
        return None
    system = pinned_file()
    return (f"{location.profile} says pinned: true, which takes effect only in {system}: a "
            "user's --profile, HPCSUITE_PROFILE or HPCSUITE_SITE_DIR still replaces this profile",
            f"install it as {system} to pin it, or remove pinned: true")


def pinned_warning(profile_path: str | None = None) -> str | None:
    """:func:`pinned_in_vain` as one line (None: nothing to say)."""
    found = pinned_in_vain(profile_path)
    return "; ".join(found) if found else None
