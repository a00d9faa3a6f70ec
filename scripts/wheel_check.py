"""Do the wheels of a wheelhouse have what they require, at the versions they require?

    python scripts/wheel_check.py DIR --image "name==1.2 other ..."   # before leaving: against a GPU image's list
    python scripts/wheel_check.py DIR --installed                      # on the node, after setup.sh --offline

Each requirement (``Requires-Dist`` of a wheel's METADATA, its environment marker evaluated for the target
Python on Linux x86_64) must be met by another wheel of DIR or, with ``--image``, by a package of the image's
list (``name`` or ``name==version``; a version not given is reported as unchecked, never as met), or, with
``--installed``, by the version this Python imports (importlib.metadata, so a ``--target`` folder on PYTHONPATH
comes first, as it does for imports). Wheels named in ``--no-deps`` are installed without their requirements and
are not checked. Exit 1 with one line per unmet requirement. Standard library and pip's vendored ``packaging``
only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare Python: pip's copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import InvalidVersion, Version


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(whl: Path) -> tuple[str, str]:
    name, version = whl.name.split("-")[:2]
    return normalized(name), version


def requirements(whl: Path) -> list[Requirement]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]


def marker_env(python_version: str) -> dict[str, str]:
    return {"python_version": python_version, "python_full_version": python_version + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def image_versions(listing: str) -> dict[str, str | None]:
    """``name`` or ``name==version`` entries (whitespace-separated) -> {normalized name: version or None}."""
    out: dict[str, str | None] = {}
    for entry in listing.split():
        name, _, version = entry.partition("==")
        out[normalized(name)] = version or None
    return out


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check(wheels: list[Path], others: dict[str, str | None], where: str, python_version: str,
          no_deps: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """(unmet, unchecked): one line per requirement of a wheel that neither another wheel nor ``others`` (name ->
    version, None when unknown; ``where`` names them in the lines) meets."""
    have = {**others, **dict(wheel_name_version(w) for w in wheels)}
    env, unmet, unchecked = marker_env(python_version), [], []
    for whl in wheels:
        name, version = wheel_name_version(whl)
        if name in no_deps:
            continue
        for req in requirements(whl):
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = normalized(req.name)
            what = f"{name} {version} needs {req}"
            if dep not in have:
                unmet.append(f"{what}: neither a wheel here nor in {where}")
            elif not req.specifier:  # any version
                continue
            elif have[dep] is None:
                unchecked.append(f"{what}: {where} has {dep}, version unknown")
            elif not satisfies(req, have[dep]):
                unmet.append(f"{what}, {where} has {dep} {have[dep]}")
    return unmet, unchecked


def satisfies(req: Requirement, version: str) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", help="the image's packages: name or name==version, whitespace-separated")
    source.add_argument("--installed", action="store_true", help="the versions this Python imports")
    p.add_argument("--python-version", default="{}.{}".format(*sys.version_info[:2]))
    p.add_argument("--no-deps", default="", help="wheels installed without their requirements (not checked)")
    args = p.parse_args(argv)
    wheels = sorted(args.dir.glob("*.whl"))
    if args.installed:
        names = {normalized(r.name) for w in wheels for r in requirements(w)}
        others, where = {n: installed_version(n) for n in names if installed_version(n)}, "this Python"
    else:
        others, where = image_versions(args.image), "the image"
    unmet, unchecked = check(wheels, others, where, args.python_version, {normalized(n) for n in args.no_deps.split()})
    for line in unchecked:
        print(f"  unchecked: {line}")
    for line in unmet:
        print(f"  UNMET: {line}")
    print(f"{len(wheels)} wheels: {len(unmet)} unmet, {len(unchecked)} unchecked requirements")
    return 1 if unmet else 0


if __name__ == "__main__":
    sys.exit(main())
