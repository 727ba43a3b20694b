"""Hardware and launch facts checked before a job starts: bf16 on a CPU that only emulates it is said before
training, not discovered as a 10x slower run; a job scope restores the distributed environment and refuses
nodes > 1 without a multi-node launcher."""

from __future__ import annotations

import logging

from gte_pro.launch.environment import cpu_has_native_bf16, emulated_bf16_warning

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_has_native_bf16(AVX2) is False
    assert cpu_has_native_bf16(SAPPHIRE) is True
    assert cpu_has_native_bf16("processor\t: 0\n") is False  # no flags line: nothing native


def test_the_warning_applies_to_bf16_on_an_emulating_cpu_only():
    message = emulated_bf16_warning("bf16-mixed", on_cpu=True, native=False)
    assert message.startswith("precision=bf16-mixed on a CPU without native bf16 (capability ")
    assert "Use precision=32-true" in message
    assert emulated_bf16_warning("bf16-true", on_cpu=True, native=False)
    assert emulated_bf16_warning("32-true", on_cpu=True, native=False) is None
    assert emulated_bf16_warning("bf16-mixed", on_cpu=False, native=False) is None  # a GPU
    assert emulated_bf16_warning("bf16-mixed", on_cpu=True, native=True) is None
    assert emulated_bf16_warning("bf16-mixed", on_cpu=True, native=None) is None  # cannot tell: say nothing


def test_building_a_bf16_trainer_on_this_cpu_warns_when_it_emulates(make_cfg, caplog, monkeypatch):
    from gte_pro.modes import build as builders

    monkeypatch.setattr(builders, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="gte_pro.modes.build"):
        builders.build_trainer(make_cfg(["debug=fast", "precision=bf16-mixed"]), callbacks=[], loggers=[])
    assert "without native bf16" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gte_pro.modes.build"):
        builders.build_trainer(make_cfg(["debug=fast"]), callbacks=[], loggers=[])
    assert "bf16" not in caplog.text


def test_a_job_scope_restores_the_distributed_environment_and_checks_the_node_count(monkeypatch):
    import os

    import pytest

    from gte_pro.launch.environment import job_scope

    monkeypatch.delenv("MASTER_PORT", raising=False)
    with job_scope(1, 1):
        os.environ["MASTER_PORT"] = "12345"  # as Lightning leaves it behind
    assert "MASTER_PORT" not in os.environ
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "NODE_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="nodes=2 needs a multi-node launcher"), job_scope(1, 2):
        pass
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")  # torchrun started this process: nodes=2 is its business
    with job_scope(1, 2):
        pass
