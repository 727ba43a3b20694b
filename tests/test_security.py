"""Security basics: no hub code runs unless asked, checkpoints load without unpickling code, no string can add a line
to an sbatch script, and no secret from the environment reaches a file of the run folder."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import CONF, REPO

# 40 characters, like a real wandb key; unique enough that any occurrence is a leak
WANDB_MARKER = "gtepro0secret0wandb0marker0a1b2c3d4e5f60"
HF_MARKER = "hf_gtepro0secret0token0marker0ff00ee11"


# --- trust_remote_code ----------------------------------------------------------------------------------------------
def _model_options() -> list[str]:
    return sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


@pytest.mark.parametrize("option", _model_options())
def test_no_model_option_runs_hub_code_unless_the_user_sets_it(make_cfg, monkeypatch, option):
    """Each preset passes trust_remote_code=False to transformers; model.trust_remote_code=true passes True."""
    from gte_pro.models import loading as model_module
    from gte_pro.modes.build import build_encoder

    seen: list[Any] = []

    class Stop(BaseException):  # not an Exception: Hydra's instantiate would wrap one
        pass

    def record(name_or_path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("trust_remote_code"))
        raise Stop  # nothing is loaded: the hub is not reachable here, and the kwargs are all this test needs

    monkeypatch.setattr(model_module.AutoTokenizer, "from_pretrained", record)
    # encoder and cross_encoder name no model; mpnet's folder is fetched by `make fetch-mpnet`, not here
    extra = ["model.name_or_path=/somewhere"] if option in ("encoder", "cross_encoder", "mpnet", "decoder") else []
    for user_value, expected in ((None, False), ("true", True)):
        seen.clear()
        overrides = [f"model={option}", *extra] + ([f"model.trust_remote_code={user_value}"] if user_value else [])
        with pytest.raises(Stop):
            build_encoder(make_cfg(overrides))
        assert seen == [expected], (option, user_value)


def test_a_string_cannot_switch_remote_code_on():
    """``model.trust_remote_code='false'`` is a non-empty string, i.e. true for transformers: refused."""
    from gte_pro import packaged_minilm_path
    from gte_pro.models.encoder import Encoder

    with pytest.raises(ValueError, match=r"model.trust_remote_code='false' is not valid; valid choices: true, false"):
        Encoder.load(packaged_minilm_path(), trust_remote_code="false")


def test_a_model_that_needs_hub_code_names_the_key_to_allow_it(monkeypatch):
    from gte_pro import packaged_minilm_path
    from gte_pro.models import encoder as model_module

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("The repository x contains custom code which must be executed to correctly load the model. "
                         "Please pass the argument `trust_remote_code=True` to allow custom code to be run.")

    monkeypatch.setattr(model_module.AutoModel, "from_pretrained", refuse)
    with pytest.raises(ValueError, match=r"set model.trust_remote_code=true to allow it"):
        model_module.Encoder.load(packaged_minilm_path())


# --- weights_only -----------------------------------------------------------------------------------------------------
def _torch_load_calls(path: Path) -> list[ast.Call]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.load", "pl_load", "_load"):
            calls.append(node)
    return calls


def test_the_package_loads_torch_files_with_weights_only_and_never_unpickles():
    """Every torch.load in gte_pro says weights_only=True, and nothing imports pickle (or dill, joblib)."""
    unsafe = []
    for path in sorted((REPO / "gte_pro").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                unsafe += [f"{path.name}: imports {n}" for n in names if n and n.split(".")[0] in
                           ("pickle", "dill", "joblib", "cloudpickle")]
        for call in _torch_load_calls(path):
            flag = next((k.value for k in call.keywords if k.arg == "weights_only"), None)
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                unsafe.append(f"{path.name}:{call.lineno}: {ast.unparse(call)}")
    assert not unsafe, unsafe


# --- sbatch -----------------------------------------------------------------------------------------------------------
class _Rendered(Exception):
    pass


def _render_sbatch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, overrides: list[str], checked: bool = True) -> str:
    """The sbatch script our SLURM launcher writes for one job, captured just before ``sbatch`` would run."""
    import submitit.slurm.slurm as submitit_slurm
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher


    def capture(self: Any, path: Any) -> Any:
        raise _Rendered(Path(path).read_text())

    monkeypatch.setattr(submitit_slurm.SlurmExecutor, "_make_submission_command", capture)
    # the script is rendered before anything runs, so no SLURM is needed: only submitit's lookup of `srun` is faked
    monkeypatch.setattr(submitit_slurm.SlurmExecutor, "affinity", classmethod(lambda cls: 1))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                                          *overrides], return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    # and our own lookup of `sbatch` and `srun` (in the module Hydra's plugin scan imported)
    monkeypatch.setattr(sys.modules[type(launcher).__module__], "slurm_missing", lambda: [])
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    launch = type(launcher).launch if checked else submitit_launcher.SlurmLauncher.launch
    with pytest.raises(_Rendered) as rendered:
        launch(launcher, [["model.lr=1e-3"]], 0)
    return str(rendered.value)


def _commands(script: str) -> list[str]:
    """The lines bash would run: not blank, not comments (``#SBATCH`` lines are comments to bash)."""
    return [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_a_job_name_with_shell_syntax_stays_one_quoted_sbatch_option(monkeypatch, tmp_path):
    script = _render_sbatch(monkeypatch, tmp_path, ["hydra.launcher.name='x; rm -rf / $(id) `id`'",
                                                    "hydra.launcher.partition='gpu;reboot'"])
    assert "#SBATCH --job-name='x; rm -rf / $(id) `id`'" in script.splitlines()
    assert "#SBATCH --partition='gpu;reboot'" in script.splitlines()
    assert _commands(script) == ["export SUBMITIT_EXECUTOR=slurm", _commands(script)[-1]]
    assert _commands(script)[-1].startswith("srun ") and "rm -rf" not in _commands(script)[-1]


@pytest.mark.parametrize("override,key", [
    ("hydra.launcher.name='x\nrm -rf / #'", "hydra.launcher.name"),
    ("hydra.launcher.partition='gpu\rreboot'", "hydra.launcher.partition"),
    ("+hydra.launcher.additional_parameters={mail-type: 'END\nrm -rf ~'}", "additional_parameters.mail-type"),
    ("hydra.launcher.setup=['module load cuda\nrm -rf ~']", "hydra.launcher.setup[0]"),
    ("hydra.launcher.comment='a\x00b'", "hydra.launcher.comment"),
])
def test_a_newline_cannot_add_a_line_to_the_sbatch_script(monkeypatch, tmp_path, override, key):
    with pytest.raises(ValueError, match=re.escape(key) + r"=.*may not hold a newline"):
        _render_sbatch(monkeypatch, tmp_path, [override])
    assert not (tmp_path / "sweep" / ".submitit").exists()  # refused before anything was written


def test_without_the_check_submitit_would_run_the_injected_line(monkeypatch, tmp_path):
    """Why the check exists: submitit's shlex quoting keeps a newline inside the quotes, but bash ends the #SBATCH
    comment at the newline and runs the rest."""
    script = _render_sbatch(monkeypatch, tmp_path, ["hydra.launcher.name='x\nrm -rf / #'"], checked=False)
    assert "rm -rf / #'" in _commands(script)


def test_an_sbatch_option_name_must_be_a_plain_word(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"'mail type' is not an sbatch option name"):
        _render_sbatch(monkeypatch, tmp_path, ["+hydra.launcher.additional_parameters={mail\\ type: x}"])


# --- secrets ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_with_secrets(tmp_path_factory, cache_dir):
    """A `debug=fast` run with every logger, with secrets in the environment (as on a cluster node)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    from gte_pro.train import train

    out = tmp_path_factory.mktemp("secret_run")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_API_KEY", WANDB_MARKER)
        env.setenv("HF_TOKEN", HF_MARKER)
        env.setenv("HUGGING_FACE_HUB_TOKEN", HF_MARKER)
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            # a user's config that reads a secret from the environment: the loggers must not save its value
            cfg = compose("train", overrides=["debug=fast", "logger=many", "callbacks=default",
                                              "+wandb_key=${oc.env:WANDB_API_KEY}"])
            hydra_cfg = compose("train", overrides=["debug=fast", "logger=many"], return_hydra_config=True)
        GlobalHydra.instance().clear()
        with open_dict(cfg):
            cfg.paths.output_dir = str(out)
            cfg.paths.cache_dir = str(cache_dir)
        # what Hydra would save as .hydra/config.yaml and .hydra/hydra.yaml in a command-line run
        (out / ".hydra").mkdir(parents=True)
        (out / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        (out / ".hydra" / "hydra.yaml").write_text(OmegaConf.to_yaml(hydra_cfg.hydra))
        train(cfg)
    return out


def test_no_secret_reaches_a_file_of_the_run_folder(run_with_secrets, capfd):
    files = [p for p in run_with_secrets.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    # the run really wrote logs, configs, checkpoints and a model card where a leak would show
    assert {"metrics.json", "README.md", "last.ckpt", "hparams.yaml", "config.yaml"} <= names
    assert any(p.suffix == ".wandb" for p in files) and any("tfevents" in p.name for p in files)
    leaks = [str(p.relative_to(run_with_secrets)) for p in files
             if any(marker.encode() in p.read_bytes() for marker in (WANDB_MARKER, HF_MARKER))]
    assert not leaks, leaks
    printed = capfd.readouterr()
    assert WANDB_MARKER not in printed.out + printed.err and HF_MARKER not in printed.out + printed.err


def test_our_checkpoints_load_with_weights_only(run_with_secrets):
    """Lightning resumes (and validates the best checkpoint) through torch.load: ours need no pickled code."""
    best = json.loads((run_with_secrets / "metrics.json").read_text())["best_checkpoint"]
    for path in {run_with_secrets / "checkpoints" / "last.ckpt", Path(best)}:
        state = torch.load(path, map_location="cpu", weights_only=True)
        assert state["global_step"] == 4 and any(k.startswith("encoder.") for k in state["state_dict"])
